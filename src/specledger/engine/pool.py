"""The process's loaded models, and everything derived from one, under one eviction rule.

Loading weights costs seconds and memory, and so do figures derived from a model (a verification-cost
curve is timed, a draft head's LM head is a copy of rows). All of them live here, keyed by the model they
belong to: its identity and precision (`model_pool_key`). One rule evicts: `retain(keys)` keeps the
entries of the listed models and drops every other model with everything derived from it. Nothing else
evicts; a process that never calls `retain` (one CLI command, one server) keeps what it loaded.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable, Iterable, TypeVar

T = TypeVar("T")
Key = tuple  # (model key, dtype, quant, int4 group size or None, device, activation bits[, max_seq_len])


def model_pool_key(model: str, dtype: str, quant: str, group_size: int | None, device: str,
                   activations: int = 16) -> Key:
    """The key of a model before it is loaded: the same file however it was named, the same precision."""
    from specledger.engine.registry import model_key

    return (model_key(model), dtype, quant, group_size if quant == "int4" else None, device, activations)


def key_of(lm: Any) -> Key:
    """The key of a loaded model (engine.loader.LoadedModel)."""
    return (lm.source, lm.dtype, lm.quant, lm.group_size if lm.quant == "int4" else None, lm.device, lm.activations)


class ModelPool:
    """Models by key, and per model key the values derived from it by name."""

    def __init__(self) -> None:
        self._models: dict[Key, Any] = {}
        self._derived: dict[Key, dict[Hashable, tuple[Any, Any]]] = {}  # name -> (owner ref or None, value)

    def __contains__(self, key: Key) -> bool:
        return key in self._models

    def get(self, key: Key) -> Any | None:
        return self._models.get(key)

    def put(self, key: Key, model: T) -> T:
        self._models[key] = model
        return model

    def load(self, key: Key, loader: Callable[[], T]) -> T:
        """The model under `key`, loaded by `loader` the first time."""
        if key not in self._models:
            self._models[key] = loader()
        return self._models[key]

    def derived(self, key: Key, name: Hashable, make: Callable[[], T], *, owner: object | None = None,
                enough: Callable[[T], bool] | None = None) -> T:
        """A value computed once from the model under `key` (which need not be in the pool itself).

        `owner`: the object the value was computed from (e.g. the model's weights); a value made from
        another object under the same name is made again and replaces it (same key, different weights).
        `enough`: whether the value held serves this call (e.g. a cost surface measured far enough);
        if not, it is made again and replaces it."""
        entries = self._derived.setdefault(key, {})
        hit = entries.get(name)
        if (hit is not None and (owner is None or (hit[0] is not None and hit[0]() is owner))
                and (enough is None or enough(hit[1]))):
            return hit[1]
        value = make()
        entries[name] = (weakref.ref(owner) if owner is not None else None, value)
        return value

    def retain(self, keys: Iterable[Key]) -> None:
        """The one eviction rule: keep the models in `keys` and what was derived from them; drop the rest."""
        keep = set(keys)
        for k in [k for k in self._models if k not in keep]:
            del self._models[k]
        for k in [k for k in self._derived if k not in keep]:
            del self._derived[k]

    def keys(self) -> set[Key]:
        return set(self._models) | set(self._derived)


POOL = ModelPool()  # the process's pool: the factory, the EAGLE strategy and the bench runner share it

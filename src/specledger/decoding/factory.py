"""Strategies by name, with their parameters, for the CLI, config files and the harness."""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel, default_dtype, load_model
from specledger.engine.registry import TARGET_ALIASES, model_key
from specledger.errors import BadInput

_CLASSES = {
    "ar": "specledger.decoding.autoregressive:Autoregressive",
    "lookup": "specledger.decoding.lookup:PromptLookup",
    "draft": "specledger.decoding.draft_model:DraftModel",
    "eagle": "specledger.decoding.eagle:EagleTree",
    "hier": "specledger.decoding.hierarchy:Hierarchy",
}
STRATEGIES = tuple(_CLASSES)


@dataclass(frozen=True)
class ModelParam:
    """A parameter whose value is a model, and how a user gives one."""

    what: str
    flag: str
    example: str  # command-line flags
    config: str  # the same in a run configuration file


MODEL_PARAMS = {
    "draft": ModelParam("a draft model", "--draft-model", "--draft-model target --draft-quant int4",
                        "draft: {model: smollm2-135m, quant: int4}"),
    "intermediate": ModelParam("an intermediate model", "--intermediate-model",
                               "--intermediate-model target --intermediate-dtype bf16",
                               "intermediate: {model: smollm2-135m, dtype: bf16}"),
}
_loaded: dict[tuple, LoadedModel] = {}


def strategy_class(name: str) -> type[Strategy]:
    if name not in _CLASSES:
        raise BadInput(f"unknown strategy {name!r} (choose from {', '.join(STRATEGIES)})")
    module, cls = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def strategy_params(name: str) -> dict[str, inspect.Parameter]:
    """The parameters a strategy accepts (its constructor's, after the target)."""
    params = list(inspect.signature(strategy_class(name).__init__).parameters.values())
    return {p.name: p for p in params[2:]}  # self, target


def _users(param: str) -> list[str]:
    return [s for s in STRATEGIES if param in strategy_params(s)]


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Every parameter known to the strategy, every required one given, values of the declared types.

    Runs before any model is loaded; returns the parameters with their values converted (e.g. 3.0 -> 3).
    """
    accepted = strategy_params(name)
    for key in params:
        if key in accepted:
            continue
        if key in MODEL_PARAMS:
            mp = MODEL_PARAMS[key]
            users = " or ".join(f"--strategy {s}" for s in _users(key))
            raise BadInput(f"strategy {name!r} does not use {mp.what} ({mp.flag} is for {users})")
        close = difflib.get_close_matches(key, accepted, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        takes = f"it accepts: {', '.join(accepted)}" if accepted else "it takes no parameters"
        raise BadInput(f"strategy {name!r} has no parameter {key!r}{hint} ({takes})")
    for key, p in accepted.items():
        if p.default is inspect.Parameter.empty and key not in params:
            if key in MODEL_PARAMS:
                mp = MODEL_PARAMS[key]
                raise BadInput(f"strategy {name!r} needs {mp.what} (e.g. {mp.example}; "
                               f"in a run configuration: {mp.config})")
            raise BadInput(f"strategy {name!r} needs the parameter {key} (e.g. -p {key}=VALUE)")
    hints = typing.get_type_hints(strategy_class(name).__init__)
    out = dict(params)
    for key, value in params.items():
        if key in MODEL_PARAMS or key not in hints:
            continue
        try:
            out[key] = TypeAdapter(hints[key], config=ConfigDict(arbitrary_types_allowed=True)).validate_python(value)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"]
            raise BadInput(f"strategy {name!r} parameter {key}={value!r}: {msg[0].lower()}{msg[1:]}") from None
    return out


def _target_key(lm: LoadedModel) -> tuple:
    return (lm.source, lm.dtype, lm.quant, lm.group_size if lm.quant == "int4" else None, lm.device)


def resolve_model(value: Any, target: LoadedModel) -> LoadedModel:
    """A model-valued parameter: a LoadedModel, a name/path, or {model, dtype, quant, group_size, max_seq_len}.

    'target' (or 'self') names the target's own file. Loaded models are shared within the process, keyed by
    the model's identity and precision, whatever name they were given (they are read-only; each run has its
    own caches); one with the target's identity and precision is the target itself.
    """
    if isinstance(value, LoadedModel):
        return value
    if isinstance(value, (list, tuple)):  # a stack of levels (hierarchy intermediates)
        return [resolve_model(v, target) for v in value]
    if isinstance(value, str):
        value = {"model": value}
    if not isinstance(value, dict) or "model" not in value:
        raise BadInput(f"a model parameter needs a model name or path (got {type(value).__name__})")
    model = target.source if value["model"] in TARGET_ALIASES else value["model"]
    quant = value.get("quant") or "none"
    dtype = value.get("dtype") or default_dtype(quant)
    group_size = int(value.get("group_size") or 32)
    device = value.get("device") or target.device
    max_seq_len = value.get("max_seq_len")
    key = (model_key(model), dtype, quant, group_size if quant == "int4" else None, device)
    if key == _target_key(target) and max_seq_len in (None, target.config.max_seq_len):
        return target
    key += (max_seq_len,)
    if key not in _loaded:
        _loaded[key] = load_model(model, dtype=dtype, quant=quant, group_size=group_size, device=device,
                                  max_seq_len=max_seq_len)
    return _loaded[key]


def make_strategy(name: str, target: LoadedModel, **params: Any) -> Strategy:
    """Build a strategy; model-valued parameters (draft, intermediate) may be LoadedModels, names or paths."""
    params = check_params(name, params)
    params = {k: (resolve_model(v, target) if k in MODEL_PARAMS else v) for k, v in params.items()}
    return strategy_class(name)(target, **params)

"""Strategies by name, with their parameters, for the CLI, config files and the harness."""

from __future__ import annotations

import importlib
from typing import Any

from specledger.decoding.params import (
    MODEL_PARAMS, STRATEGIES, check_keys, missing_role, params_class, parse_params,
)
from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel, default_dtype, load_model
from specledger.engine.pool import POOL, key_of, model_pool_key
from specledger.engine.registry import TARGET_ALIASES
from specledger.errors import BadInput

_CLASSES = {
    "ar": "specledger.decoding.autoregressive:Autoregressive",
    "lookup": "specledger.decoding.drafters.lookup:PromptLookup",
    "draft": "specledger.decoding.drafters.draft_model:DraftModel",
    "eagle": "specledger.decoding.drafters.eagle:EagleTree",
    "hier": "specledger.decoding.drafters.hierarchy:Hierarchy",
}
assert tuple(_CLASSES) == STRATEGIES


def strategy_class(name: str) -> type[Strategy]:
    params_class(name)  # an unknown name: one line saying which exist
    module, cls = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Every parameter known to the strategy (decoding/params.py), every model it needs given, values of the
    declared types. Runs before any model is loaded; returns the parameters given, converted (e.g. 3.0 -> 3).
    """
    check_keys(name, list(params))
    for role in params_class(name).roles:
        if role not in params:
            raise BadInput(missing_role(name, role))
    values = parse_params(name, params)
    return {**values.arguments(), **{k: v for k, v in params.items() if k in MODEL_PARAMS}}


def resolve_model(value: Any, target: LoadedModel) -> LoadedModel | list[LoadedModel]:
    """A model-valued parameter: a LoadedModel, a name/path, or {model, dtype, quant, group_size, activations,
    max_seq_len}; a list or tuple of them resolves to a list (a stack of levels).

    'target' (or 'self') names the target's own file. Loaded models are shared within the process, keyed by
    the model's identity and precision, whatever name they were given, in the process's model pool (they are
    read-only; each run has its own caches); one with the target's identity and precision is the target itself.
    """
    if isinstance(value, (list, tuple)):  # a stack of levels (hierarchy intermediates), each one model
        return [_resolve_one(v, target) for v in value]
    return _resolve_one(value, target)


def _resolve_one(value: Any, target: LoadedModel) -> LoadedModel:
    if isinstance(value, LoadedModel):
        return value
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
    activations = int(value.get("activations") or 16)
    key = model_pool_key(model, dtype, quant, group_size, device, activations)
    if key == key_of(target) and max_seq_len in (None, target.config.max_seq_len):
        return target
    if max_seq_len is not None:
        key += (max_seq_len,)
    return POOL.load(key, lambda: load_model(model, dtype=dtype, quant=quant, group_size=group_size,
                                             device=device, max_seq_len=max_seq_len, activations=activations))


def make_strategy(name: str, target: LoadedModel, **params: Any) -> Strategy:
    """Build a strategy; model-valued parameters (draft, intermediate) may be LoadedModels, names or paths."""
    params = check_params(name, params)
    params = {k: (resolve_model(v, target) if k in MODEL_PARAMS else v) for k, v in params.items()}
    return strategy_class(name)(target, **params)

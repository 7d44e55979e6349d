"""Strategies by name, with their parameters, for the CLI, config files and the harness."""

from __future__ import annotations

from typing import Any

from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel, load_model
from specledger.errors import BadInput

STRATEGIES = ("ar", "lookup", "draft", "eagle", "hier")
MODEL_PARAMS = ("draft", "intermediate")  # parameters whose value is a model
_loaded: dict[tuple, LoadedModel] = {}


def resolve_model(value: Any, target: LoadedModel) -> LoadedModel:
    """A model-valued parameter: a LoadedModel, a name/path, or {model, dtype, quant, group_size}.

    Loaded models are shared within the process (they are read-only; each run has its own caches).
    """
    if isinstance(value, LoadedModel):
        return value
    if isinstance(value, (list, tuple)):  # a stack of levels (hierarchy intermediates)
        return [resolve_model(v, target) for v in value]
    if isinstance(value, str):
        value = {"model": value}
    if not isinstance(value, dict) or "model" not in value:
        raise BadInput(f"a model parameter needs a model name or path (got {type(value).__name__})")
    spec = {"model": value["model"], "dtype": value.get("dtype"), "quant": value.get("quant", "none"),
            "group_size": int(value.get("group_size", 32)), "device": value.get("device", target.device)}
    if spec["model"] in ("target", "self"):
        spec["model"] = target.source
    key = tuple(sorted((k, str(v)) for k, v in spec.items()))
    if key not in _loaded:
        _loaded[key] = load_model(spec.pop("model"), **spec)
    return _loaded[key]


def make_strategy(name: str, target: LoadedModel, **params: Any) -> Strategy:
    """Build a strategy; model-valued parameters (draft, intermediate, head) may be LoadedModels or paths."""
    if name == "ar":
        from specledger.decoding.autoregressive import Autoregressive as cls
    elif name == "lookup":
        from specledger.decoding.lookup import PromptLookup as cls
    elif name == "draft":
        from specledger.decoding.draft_model import DraftModel as cls
    elif name == "eagle":
        from specledger.decoding.eagle import EagleTree as cls
    elif name == "hier":
        from specledger.decoding.hierarchy import Hierarchy as cls
    else:
        raise BadInput(f"unknown strategy {name!r} (choose from {', '.join(STRATEGIES)})")
    params = {k: (resolve_model(v, target) if k in MODEL_PARAMS else v) for k, v in params.items()}  # type: ignore[misc]
    try:
        return cls(target, **params)
    except TypeError as exc:
        raise BadInput(f"strategy {name!r}: {exc}") from None

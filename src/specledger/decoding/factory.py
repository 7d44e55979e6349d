"""Strategies by name, with their parameters, for the CLI, config files and the harness."""

from __future__ import annotations

from typing import Any

from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput

STRATEGIES = ("ar", "lookup", "draft", "eagle", "hier")


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
    try:
        return cls(target, **params)
    except TypeError as exc:
        raise BadInput(f"strategy {name!r}: {exc}") from None

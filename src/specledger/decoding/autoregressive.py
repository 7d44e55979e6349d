"""The baseline: one target forward per token (no drafter)."""

from __future__ import annotations

from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel


class Autoregressive(Strategy):
    name = "ar"

    def __init__(self, target: LoadedModel) -> None:  # (no drafts to size: no draft_length)
        super().__init__(target)

    def batch_drafter(self, n_slots: int) -> None:
        return None

"""The baseline: one target forward per token (no drafter)."""

from __future__ import annotations

from specledger.decoding.strategy import Strategy


class Autoregressive(Strategy):
    name = "ar"

    def batch_drafter(self, n_slots: int) -> None:
        return None

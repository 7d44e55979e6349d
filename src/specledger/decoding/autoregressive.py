"""The baseline: one target forward per token."""

from __future__ import annotations

from specledger.decoding.strategy import Context, StepStats, Strategy, clock
from specledger.decoding.tree import Tree


class Autoregressive(Strategy):
    name = "ar"

    def batch_drafter(self, n_slots: int) -> None:
        return None

    def step(self, ctx: Context) -> StepStats:
        t = clock(ctx.target.device)
        self.verify_and_accept(ctx, Tree())
        return StepStats(appended=1, verify_s=clock(ctx.target.device) - t)

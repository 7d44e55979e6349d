"""The interface every decoding strategy implements: start, then steps (propose -> verify -> update).

Each step reports the same statistics, so autoregressive decoding, prompt lookup, draft
chains, EAGLE trees and hierarchies are measured and compared the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specledger.decoding.cached_model import CachedModel
from specledger.decoding.sampling import SamplingParams
from specledger.engine.loader import LoadedModel
from specledger.engine.timing import clock as clock  # re-exported: the strategies time their levels with it


@dataclass
class LevelStats:
    """One drafting level: what it proposed to the level above and what that level accepted."""

    name: str
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    time_s: float = 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    def as_dict(self) -> dict:
        return {"name": self.name, "proposed": self.proposed, "accepted": self.accepted, "steps": self.steps,
                "acceptance": self.acceptance, "time_s": self.time_s}


@dataclass
class StepStats:
    appended: int  # tokens added to the sequence by this target step (bonus included)
    proposed: list[int] = field(default_factory=list)  # per level, bottom (drafter) first
    accepted: list[int] = field(default_factory=list)
    level_s: list[float] = field(default_factory=list)  # time spent in each drafting level
    verify_s: float = 0.0  # the target's verification pass and acceptance


@dataclass
class Context:
    target: CachedModel
    prompt: list[int]
    sp: SamplingParams
    gen: torch.Generator | None

    def budget(self) -> int:
        """How many draft tokens are worth proposing now (room in the cache, tokens still wanted)."""
        generated = len(self.target.tokens) - len(self.prompt)
        return max(0, min(self.target.room(), self.sp.max_new_tokens - generated - 1))


class Strategy:
    """Subclasses set `name`, `level_names` and implement `step`; `start` prefills drafters."""

    name = "base"
    level_names: list[str] = []
    lookahead = 0  # most tokens a step may put in the target's cache beyond the sequence

    def __init__(self, target: LoadedModel) -> None:
        self.target = target

    def params(self) -> dict:
        return {}

    def start(self, ctx: Context) -> None:
        """Prefill whatever the strategy keeps besides the target (timed as draft prefill)."""

    def step(self, ctx: Context) -> StepStats:
        raise NotImplementedError

    def verify_and_accept(self, ctx: Context, tree) -> tuple[list[int], "torch.Tensor", object]:
        """The target's verification of a tree: one forward, the shared verifier, cache update."""
        from specledger.decoding.verify import verify

        fwd = ctx.target.forward(tree)
        verdict = verify(fwd.logits, tree, ctx.sp, ctx.gen)
        new = verdict.tokens(tree)
        feats = ctx.target.accept(fwd, verdict.path, new)
        return new, feats, verdict

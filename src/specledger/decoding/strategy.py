"""The interface every decoding strategy implements: start, then steps (propose -> verify -> update).

Each step reports the same statistics, so autoregressive decoding, prompt lookup, draft
chains, EAGLE trees and hierarchies are measured and compared the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specledger.decoding.cached_model import CachedModel
from specledger.decoding.drafter import Drafter, DraftSeq
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.tree import Tree
from specledger.decoding.verify import Verdict, verify
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput
from specledger.engine.timing import clock as clock  # re-exported: the strategies time their levels with it
from specledger.spec_stats import LevelStats as LevelStats  # re-exported: a result's per-level statistics


@dataclass
class StepStats:
    """What one target step did. verifications[level] lists each verification at that level (drafter first)
    as (tokens proposed to it, tokens it accepted); a hierarchy's lower levels verify several times a step."""

    appended: int  # tokens added to the sequence by this target step (bonus included)
    verifications: list[list[tuple[int, int]]] = field(default_factory=list)
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
    draft_length = "adaptive"  # how a batch sizes its drafter's drafts (decoding/draft_policy.py)

    def __init__(self, target: LoadedModel) -> None:
        self.target = target

    def params(self) -> dict:
        return {}

    def start(self, ctx: Context) -> None:
        """Prefill whatever the strategy keeps besides the target (timed as draft prefill)."""

    def batch_drafter(self, n_slots: int) -> Drafter | None:
        """The strategy's drafter for the continuous-batching scheduler (None: autoregressive), following up to
        n_slots sequences; a strategy that cannot be batched says so."""
        raise BadInput(f"strategy {self.name!r} runs one request at a time (not in a continuous batch)")

    def step(self, ctx: Context) -> StepStats:
        raise NotImplementedError

    def verify_and_accept(self, ctx: Context, tree: Tree) -> tuple[list[int], torch.Tensor, Verdict]:
        """The target's verification of a tree: one forward, the shared verifier, cache update."""
        fwd = ctx.target.forward(tree)
        verdict = verify(fwd.logits, tree, ctx.sp, ctx.gen)
        new = verdict.tokens(tree)
        feats = ctx.target.accept(fwd, verdict.path, new)
        return new, feats, verdict


class Speculative(Strategy):
    """A drafter's tree verified by the target: the one draft-then-verify step every drafting strategy shares.

    Subclasses give the drafter (`make_drafter`, called per generation) and may size each step's draft
    (`draft_size`) and learn from its outcome (`after_step`)."""

    drafter: Drafter

    def make_drafter(self, ctx: Context) -> Drafter:
        raise NotImplementedError

    def draft_size(self, ctx: Context, budget: int) -> int:
        """Nodes to propose this step, at most `budget` (room left and tokens still wanted)."""
        return budget

    def after_step(self, ctx: Context, tree: Tree, new: list[int], step_s: float) -> None:
        """Called after every step with what was proposed, what was emitted and the step's time."""

    def start(self, ctx: Context) -> None:
        self.drafter = self.make_drafter(ctx)
        self.seq = DraftSeq(0, ctx.target.tokens, ctx.sp, ctx.gen)
        self.drafter.begin(self.seq, ctx.target.last_hidden if self.drafter.wants_features else None)

    def step(self, ctx: Context) -> StepStats:
        dev, seq = ctx.target.device, self.seq
        seq.tokens = ctx.target.tokens
        t0 = clock(dev)
        tree = self.drafter.propose([seq], [self.draft_size(ctx, ctx.budget())])[0]
        t1 = clock(dev)
        new, feats, verdict = self.verify_and_accept(ctx, tree)
        t2 = clock(dev)
        self.drafter.accept(seq, feats if self.drafter.wants_features else None)
        t3 = clock(dev)
        self.after_step(ctx, tree, new, t3 - t0)
        return StepStats(len(new), [[(len(tree), len(verdict.path))]], [(t1 - t0) + (t3 - t2)], t2 - t1)

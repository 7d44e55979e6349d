"""A drafter driven for a continuous batch: each request's drafting state, and each step's drafts.

The scheduler (scheduler.py) owns the batch; this owns what speculation adds to it: the drafter follows a
request from its first token to its end; every step the draft policy (sizing/policy.py: a fixed K, or the
cost-aware planner) sizes each decoding sequence's draft, zero included, and the drafter proposes them; after
verification each request's statistics, and whatever the policy learns, move.

Drafting is an optimisation: a failure in planning a pass (the policy's sizing, the drafter's proposals) or in
the policy's learning degrades that pass to no drafting (every sequence is verified without a draft, which is
lossless) instead of failing the batch's requests; each such failure is counted (`failures`, the server's
`specledger:draft_failures_total`) and logged in one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from specledger.decoding.sizing.planner import CostSurface
from specledger.decoding.sizing.policy import make_policy
from specledger.decoding.drafters.base import Drafter, DraftSeq
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel
from specledger.engine.slot_cache import SlotCache
from specledger.engine.timing import clock
from specledger.spec_stats import LevelStats

log = logging.getLogger("specledger.decoding")


@dataclass
class DraftState:
    """One request's part in batched speculation."""

    seq: DraftSeq
    level: LevelStats
    prefill_s: float = 0.0  # the drafter's prefill of this request
    draft_s: float = 0.0  # its share of drafting and planning time


class Speculation:
    """draft_length: the policy's name (policy.DRAFT_LENGTHS); cost: the adaptive planner's surface."""

    def __init__(self, lm: LoadedModel, drafter: Drafter, max_batch: int,
                 cost: CostSurface | Callable[[int], float] | None = None, draft_length: str = "adaptive") -> None:
        self.drafter = drafter
        self.device = lm.model.device
        self.policy = make_policy(draft_length, lm, drafter, max_batch, cost)
        self.last_plan_s = 0.0  # seconds the latest plan took (proposals included)
        self.failures = 0  # passes degraded to no drafting, and policy updates skipped, by an exception

    def _failed(self, what: str, exc: Exception) -> None:
        """Count a failure; log it in one line (the 1st, 2nd, 4th, 8th, ...: a drafter broken for good would
        otherwise log every pass)."""
        self.failures += 1
        n = self.failures
        if n & (n - 1) == 0:
            log.warning("%s failed (%s: %s); going on without drafting there (failure %d)", what,
                        type(exc).__name__, exc, n)

    def observe(self, step_s: float, forward_s: float, rows: int, n_seqs: int, n_drafting: int) -> None:
        """A pass without prefill: its forward's rows and seconds, and its time outside forward and plan."""
        try:
            self.policy.observe(step_s, forward_s, self.last_plan_s, rows, n_seqs, n_drafting)
        except Exception as exc:  # noqa: BLE001 - what the policy learns of a pass is not worth a request
            self._failed("the draft policy's measurement", exc)

    def begin(self, key: Hashable, tokens: list[int], sp: SamplingParams, gen: torch.Generator | None,
              features: torch.Tensor | None, kv: tuple[SlotCache, int] | None = None) -> DraftState:
        """Follow a request once its prompt is cached and its first token drawn (the drafter's prefill counts in
        the request's TTFT, as in generate()); kv: the target's cache and the request's slot."""
        t0 = clock(self.device)
        seq = DraftSeq(key, tokens, sp, gen, kv)
        self.drafter.begin(seq, features if self.drafter.wants_features else None)
        self.policy.begin(key)
        return DraftState(seq, LevelStats(name=self.drafter.name, steps=0, drafts=0), clock(self.device) - t0)

    def plan(self, states: list[DraftState], caps: list[int], prefill_rows: int) -> list[Tree]:
        """Each decoding sequence's draft for the next pass (an empty tree: none); caps: room left per sequence.
        A failure anywhere in it: no drafts this pass (module docstring)."""
        t0 = time.perf_counter()
        seqs = [s.seq for s in states]
        try:
            ks = self.policy.plan(seqs, caps, prefill_rows)
            drafting = [i for i, k in enumerate(ks) if k]
            trees = [Tree() for _ in states]
            if drafting:
                proposed = self.drafter.propose([seqs[i] for i in drafting], [ks[i] for i in drafting])
                for i, t in zip(drafting, proposed):
                    trees[i] = t
        except Exception as exc:  # noqa: BLE001 - the pass goes on undrafted; its requests lose nothing
            self._failed("planning this pass's drafts", exc)
            trees = [Tree() for _ in states]
        self.last_plan_s = time.perf_counter() - t0
        for s in states:
            s.draft_s += self.last_plan_s / len(states)
        return trees

    def accepted(self, st: DraftState, tokens: list[int], tree: Tree, path: list[int],
                 features: torch.Tensor | None) -> None:
        """The target verified `tree` and kept `path`; the sequence is now `tokens`."""
        st.seq.tokens = tokens
        self.drafter.accept(st.seq, features if self.drafter.wants_features else None)
        st.level.observe(len(tree), len(path))
        if len(tree):
            try:
                self.policy.accepted(st.seq.key, len(tree), path)
            except Exception as exc:  # noqa: BLE001 - the policy's estimate misses one update; the request goes on
                self._failed("the draft policy's acceptance update", exc)

    def end(self, st: DraftState) -> list[LevelStats]:
        """The request's levels, lowest first: a hierarchy's inner levels (what each intermediate verified), then
        the drafter's own as the target verified it, with what is left of the request's drafting time (its share
        of each plan; the inner levels' seconds are the drafting sequences' own, so a share can fall short)."""
        inner = self.inner_levels(st.seq.key)
        self.drafter.end(st.seq)
        self.policy.end(st.seq.key)
        st.level.time_s = max(0.0, st.draft_s - sum(lv.time_s or 0.0 for lv in inner))
        return [*inner, st.level]

    def inner_levels(self, key: Hashable | None) -> list[LevelStats]:
        """A drafter with levels of its own below the target's (model.ModelDrafter) reports them; key None:
        their names alone (a request that ended before its first token)."""
        levels = getattr(self.drafter, "inner_levels", None)
        return levels(key) if levels is not None else []

"""A drafter driven for a continuous batch: each request's drafting state, and each step's plan.

The scheduler (scheduler.py) owns the batch; this owns what speculation adds to it: the drafter follows a
request from its first token to its end; every step the planner (draft_budget.plan_drafts) sizes each
decoding sequence's draft, zero included, from the verification-cost surface, the drafter's own cost and
the sequence's running acceptance; after verification each request's statistics and acceptance move.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from specledger.decoding.draft_budget import (PRIOR, AcceptanceEMA, CostSurface, FittedSurface, GainCalibration,
                                               PassCalibration, RankAcceptance, StepOverhead, cost_surface, plan_drafts)
from specledger.decoding.drafter import Drafter, DraftSeq
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel
from specledger.engine.timing import clock
from specledger.spec_stats import LevelStats

RELAX = 0.005  # per pass without any draft: the population estimate's pull back toward the prior
# Verified draft nodes the population estimate needs behind it before more than one sequence a pass drafts: until
# then (at the start, and once the estimate has drifted back toward the prior) one sequence tries the drafter.
# A prior of 0.6 for a drafter that is accepted 15% of the time had every sequence of a batch draft at once. Nor is
# it tried beside a joining prompt's chunk, where its rows are priced by extrapolating the surface: measured, the
# first drafts beside chunks cost 2-4x their price.
EVIDENCE = 16.0


@dataclass
class DraftState:
    """One request's part in batched speculation."""

    seq: DraftSeq
    level: LevelStats
    acc: AcceptanceEMA | RankAcceptance
    prefill_s: float = 0.0  # the drafter's prefill of this request
    draft_s: float = 0.0  # its share of drafting and planning time


class BatchDrafting:
    def __init__(self, lm: LoadedModel, drafter: Drafter, max_batch: int,
                 cost: CostSurface | Callable[[int], float] | None = None) -> None:
        self.drafter = drafter
        self.device = lm.model.device
        # A given cost is the caller's model, used as it is; the measured surface is corrected by the passes this
        # batch runs. It is probed as far as a pass may reach: ~4 rows per sequence of a full batch, or one whole
        # proposal beside the others' rows (an EAGLE tree at batch 2 put 50 rows in a pass: a surface probed to 8
        # rows priced its 45 extra rows at 2 ms, measured 30 ms).
        self.fit: FittedSurface | None = None
        if cost is None:
            reach = max(4 * max_batch, max_batch + drafter.max_tokens)
            cost = self.fit = FittedSurface(cost_surface(lm, max_rows=reach, n_seqs=min(8, max_batch)))
        self.cost: Callable[[int], float] = cost
        drafter.draft_cost([1])  # whatever the drafter measures of its own cost, now rather than in a request
        self.last_drafted = 0  # draft tokens in the latest pass
        # What this drafter's recent drafts accepted, over every request: a new request starts from it rather than
        # from the default prior (a short request would spend most of its passes unlearning an optimistic one).
        # With no draft verified it drifts back toward the prior, so speculation is tried again once it may pay.
        # A drafter that measured its own per-token acceptance (drafter.prior: a draft model's agreement with the
        # target) starts from that instead of the default prior: a quantized copy of the target, accepted ~95% of
        # the time, was priced at 0.6 and never tried at batch 1, where it pays.
        a0 = drafter.prior if drafter.prior is not None else PRIOR
        self.population: AcceptanceEMA | RankAcceptance = (RankAcceptance(a0, prior=a0) if drafter.tree
                                                           else AcceptanceEMA(a0, prior=a0))
        self.evidence = 0.0  # verified nodes behind it, decaying as it drifts
        self.overhead = StepOverhead()  # what a drafting sequence adds outside the pass (the scheduler measures)
        self.calibration = GainCalibration()  # how far the estimates' expected tokens were accepted
        self.pass_price = PassCalibration()  # how far drafting's predicted seconds were what it added
        self.last_plan_s = 0.0  # seconds the latest plan took (proposals included)
        self.last_extra = 0.0  # seconds the latest plan predicted its rows add to the step, drafting aside (unscaled)

    def observe(self, step_s: float, forward_s: float, rows: int, n_seqs: int, n_drafting: int) -> None:
        """A pass without prefill: its forward's rows and seconds, and its time outside forward and plan."""
        if n_drafting and self.last_extra > 0:  # what drafted rows added: the step over a plain pass, drafting aside
            plain = self.cost(n_seqs) + (self.overhead.base or 0.0) * n_seqs
            self.pass_price.observe(self.last_extra, step_s - self.last_plan_s - plain)
        if self.fit is not None:
            self.fit.observe(rows, forward_s)
        self.overhead.observe(step_s - forward_s - self.last_plan_s, n_seqs, n_drafting)

    @property
    def wants_features(self) -> bool:
        return self.drafter.wants_features

    def begin(self, key: Hashable, tokens: list[int], sp: SamplingParams, gen: torch.Generator | None,
              features: torch.Tensor | None) -> DraftState:
        """Follow a request once its prompt is cached and its first token drawn (the drafter's prefill counts in
        the request's TTFT, as in generate())."""
        t0 = clock(self.device)
        seq = DraftSeq(key, tokens, sp, gen)
        self.drafter.begin(seq, features if self.drafter.wants_features else None)
        acc = copy.deepcopy(self.population)
        return DraftState(seq, LevelStats(name=self.drafter.name, steps=0, drafts=0), acc, clock(self.device) - t0)

    def plan(self, states: list[DraftState], caps: list[int], prefill_rows: int) -> list[Tree]:
        """Each decoding sequence's draft for the next pass (an empty tree: none); caps: room left per sequence."""
        t0 = time.perf_counter()
        d = self.drafter
        seqs = [s.seq for s in states]
        avail = d.candidates(seqs, caps)  # (each drafter caps at its max_tokens; caps: the tokens left)
        gains = [self.calibration.scaled(s.acc.gains(n)) for s, n in zip(states, avail)]
        n = len(states)
        ks = plan_drafts(gains, n, n, self.cost, d.draft_cost, self.overhead.extra, beside=prefill_rows,
                         max_drafting=None if self.evidence >= EVIDENCE else 0 if prefill_rows else 1,
                         price=self.pass_price.factor)
        self.last_drafted = sum(ks)
        self.last_extra = (self.cost(n + prefill_rows + self.last_drafted) - self.cost(n + prefill_rows)
                           + self.overhead.extra * sum(1 for k in ks if k)) if self.last_drafted else 0.0
        if not self.last_drafted:
            self.population.relax(RELAX)
            self.evidence *= 1.0 - RELAX
        drafting = [i for i, k in enumerate(ks) if k]
        trees = [Tree() for _ in states]
        if drafting:
            for i, t in zip(drafting, d.propose([seqs[i] for i in drafting], [ks[i] for i in drafting])):
                trees[i] = t
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
            self.calibration.observe(sum(st.acc.gains(len(tree))), len(path))
            st.acc.update(len(tree), path)
            self.population.update(len(tree), path)
            self.evidence += len(tree)

    def end(self, st: DraftState) -> list[LevelStats]:
        """The request's levels, lowest first: a hierarchy's inner levels (what each intermediate verified), then
        the drafter's own as the target verified it; their seconds add up to the request's drafting time."""
        inner = self.inner_levels(st.seq.key)
        self.drafter.end(st.seq)
        st.level.time_s = st.draft_s - sum(lv.time_s or 0.0 for lv in inner)
        return [*inner, st.level]

    def inner_levels(self, key: Hashable | None) -> list[LevelStats]:
        """A drafter with levels of its own below the target's (hierarchy.HierDrafter) reports them; key None:
        their names alone (a request that ended before its first token)."""
        levels = getattr(self.drafter, "inner_levels", None)
        return levels(key) if levels is not None else []

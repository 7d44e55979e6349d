"""How many nodes each decoding sequence of a batch drafts a step: one interface, two policies.

`fixed`: every decoding sequence drafts min(K, room) nodes every step, K the drafter's max_nodes (the strategy
parameter of that name: decoding/params.py): reproducible, nothing measured, what vLLM, SGLang and llama.cpp run.
`adaptive` (the default): the cost-aware planner (planner.plan_drafts) sizes each draft, zero included,
from the verification-cost surface, the drafter's own cost and each sequence's running acceptance; every
estimator it needs lives here, behind it. Speculation (loop/speculation.py) drives either one: the drafter's
lifecycle and the statistics a request reports are the same.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable

from specledger.decoding.sizing.planner import (PRIOR, AcceptanceEMA, CostSurface, FittedSurface, RankAcceptance,
                                               StepOverhead, cost_surface, gain_calibration, pass_calibration,
                                               plan_drafts)
from specledger.decoding.drafters.base import Drafter, DraftSeq
from specledger.decoding.params import check_draft_length
from specledger.engine.loader import LoadedModel

RELAX = 0.005  # per pass without any draft: the population estimate's pull back toward the prior
# Verified draft nodes the population estimate needs behind it before more than one sequence a pass drafts: until
# then (at the start, and once the estimate has drifted back toward the prior) one sequence tries the drafter.
# A prior of 0.6 for a drafter that is accepted 15% of the time had every sequence of a batch draft at once. Nor is
# it tried beside a joining prompt's chunk, where its rows are priced by extrapolating the surface: measured, the
# first drafts beside chunks cost 2-4x their price.
EVIDENCE = 16.0


class DraftPolicy:
    """What a policy hears of a batch (each hook a no-op here) and how it plans."""

    name: str  # recorded in a run's params as draft_length

    def begin(self, key: Hashable) -> None:
        """A request decodes from now on (its first token drawn)."""

    def plan(self, seqs: list[DraftSeq], caps: list[int], prefill_rows: int) -> list[int]:
        """Nodes each decoding sequence drafts for the next pass (0: none), at most its cap (room, tokens left);
        prefill_rows: the joining prompts' rows in the same pass."""
        raise NotImplementedError

    def accepted(self, key: Hashable, drafted: int, path: list[int]) -> None:
        """The sequence's draft of `drafted` nodes was verified and `path` of it kept."""

    def observe(self, step_s: float, forward_s: float, plan_s: float, rows: int, n_seqs: int,
                n_drafting: int) -> None:
        """A pass without prefill: its step's, forward's and plan's seconds, rows, sequences and drafting ones."""

    def end(self, key: Hashable) -> None:
        """The request left."""


class FixedK(DraftPolicy):
    """Every decoding sequence drafts min(k, cap) nodes every step, whatever was accepted and whatever it costs."""

    name = "fixed"

    def __init__(self, k: int) -> None:
        self.k = k

    def plan(self, seqs: list[DraftSeq], caps: list[int], prefill_rows: int) -> list[int]:
        return [min(self.k, c) for c in caps]


class Adaptive(DraftPolicy):
    """The planner: each step's drafts chosen for the pass's expected tokens per second (sizing/planner.py)."""

    name = "adaptive"

    def __init__(self, lm: LoadedModel, drafter: Drafter, max_batch: int,
                 cost: CostSurface | Callable[[int], float] | None = None) -> None:
        self.drafter = drafter
        # A given cost is the caller's model, used as it is; the measured surface is corrected by the passes this
        # batch runs. It is probed as far as a pass may reach: ~4 rows per sequence of a full batch, or one whole
        # proposal beside the others' rows (an EAGLE tree at batch 2 put 50 rows in a pass: a surface probed to 8
        # rows priced its 45 extra rows at 2 ms, measured 30 ms).
        self.fit: FittedSurface | None = None
        if cost is None:
            reach = max(4 * max_batch, max_batch + drafter.max_nodes)
            cost = self.fit = FittedSurface(cost_surface(lm, max_rows=reach, n_seqs=min(8, max_batch)))
        self.cost: Callable[[int], float] = cost
        drafter.draft_cost([1])  # whatever the drafter measures of its own cost, now rather than in a request
        # What this drafter's recent drafts accepted, over every request: a new request starts from it rather than
        # from the default prior (a short request would spend most of its passes unlearning an optimistic one).
        # With no draft verified it drifts back toward the prior, so speculation is tried again once it may pay.
        # A drafter that measured its own per-token acceptance (drafter.prior: a draft model's agreement with the
        # target) starts from that instead of the default prior: a quantized copy of the target, accepted ~95% of
        # the time, was priced at 0.6 and never tried at batch 1, where it pays.
        a0 = drafter.prior if drafter.prior is not None else PRIOR
        self.population: AcceptanceEMA | RankAcceptance = (RankAcceptance(a0, prior=a0) if drafter.tree
                                                           else AcceptanceEMA(a0, prior=a0))
        self.acc: dict[Hashable, AcceptanceEMA | RankAcceptance] = {}  # each request's own, from the population
        self.evidence = 0.0  # verified nodes behind it, decaying as it drifts
        self.overhead = StepOverhead()  # what a drafting sequence adds outside the pass (the scheduler measures)
        self.calibration = gain_calibration()  # how far the estimates' expected tokens were accepted
        self.pass_price = pass_calibration()  # how far drafting's predicted seconds were what it added
        self.last_extra = 0.0  # seconds the latest plan predicted its rows add to the step, drafting aside (unscaled)

    def begin(self, key: Hashable) -> None:
        self.acc[key] = copy.deepcopy(self.population)

    def plan(self, seqs: list[DraftSeq], caps: list[int], prefill_rows: int) -> list[int]:
        d = self.drafter
        avail = d.candidates(seqs, caps)  # (each drafter caps at its max_nodes; caps: the tokens left)
        gains = [self.calibration.scaled(self.acc[s.key].gains(n)) for s, n in zip(seqs, avail)]
        n = len(seqs)
        ks = plan_drafts(gains, n, n, self.cost, d.draft_cost, self.overhead.extra, beside=prefill_rows,
                         max_drafting=None if self.evidence >= EVIDENCE else 0 if prefill_rows else 1,
                         price=self.pass_price.factor)
        drafted = sum(ks)
        self.last_extra = (self.cost(n + prefill_rows + drafted) - self.cost(n + prefill_rows)
                           + self.overhead.extra * sum(1 for k in ks if k)) if drafted else 0.0
        if not drafted:
            self.population.relax(RELAX)
            self.evidence *= 1.0 - RELAX
        return ks

    def accepted(self, key: Hashable, drafted: int, path: list[int]) -> None:
        acc = self.acc[key]
        self.calibration.observe(sum(acc.gains(drafted)), len(path))
        acc.update(drafted, path)
        self.population.update(drafted, path)
        self.evidence += drafted

    def observe(self, step_s: float, forward_s: float, plan_s: float, rows: int, n_seqs: int,
                n_drafting: int) -> None:
        if n_drafting and self.last_extra > 0:  # what drafted rows added: the step over a plain pass, drafting aside
            plain = self.cost(n_seqs) + (self.overhead.base or 0.0) * n_seqs
            self.pass_price.observe(self.last_extra, step_s - plan_s - plain)
        if self.fit is not None:
            self.fit.observe(rows, forward_s)
        self.overhead.observe(step_s - forward_s - plan_s, n_seqs, n_drafting)

    def end(self, key: Hashable) -> None:
        self.acc.pop(key, None)


def make_policy(name: str, lm: LoadedModel, drafter: Drafter, max_batch: int,
                cost: CostSurface | Callable[[int], float] | None = None) -> DraftPolicy:
    """The policy called `name` for this drafter (cost: the adaptive planner's; the fixed policy measures nothing)."""
    if check_draft_length(name) == "fixed":
        return FixedK(drafter.max_nodes)
    return Adaptive(lm, drafter, max_batch, cost)

"""How many tokens each sequence in a batch drafts this step, zero included.

In a batch, one verification pass carries every sequence's drafted rows, so its time grows with the whole batch:
T(rows), the verification-cost surface, measured once per model, precision and device by a short probe of ragged
passes and kept for the process. Each sequence has a running estimate a of the chance that its next drafted token
is accepted (an exponential moving average over the chain positions it has had verified); drafting k tokens is then
worth E[accepted | k] = a + a^2 + ... + a^k tokens. plan_drafts keeps the draft tokens, best first across the batch,
that maximise the pass's expected tokens per second. Once the pass is compute-bound (T grows with every row),
rejected rows cost real throughput and drafting turns itself down; when the batch drains, rows are cheap again and
drafting comes back.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specledger.engine.loader import LoadedModel
from specledger.engine.pool import POOL, key_of
from specledger.engine.timing import clock

SURFACE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class CostSurface:
    """Seconds of one ragged pass as a function of its total rows (piecewise linear, never decreasing)."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.seconds) or list(self.rows) != sorted(set(self.rows)):
            raise ValueError("a cost surface needs increasing row counts, one time each")
        mono, top = [], 0.0
        for s in self.seconds:  # measurement noise must not make a bigger pass look cheaper
            top = max(top, s)
            mono.append(top)
        object.__setattr__(self, "seconds", tuple(mono))

    def __call__(self, n: float) -> float:
        xs, ys = self.rows, self.seconds
        if n <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        if len(xs) == 1:
            return ys[0]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (n - xs[-1])


class FittedSurface:
    """The probe's surface corrected by the passes the scheduler actually runs.

    The probe measures passes at 64-token contexts on an otherwise idle model; a running batch has longer
    contexts (attention grows with them) and the machine's own load, and the planner priced drafted rows
    15-55% below what they cost once measured. Each decode pass (rows, seconds) moves an EMA of measured /
    probed at the knots either side of its row count, weighted by nearness; a knot not yet seen takes the
    ratio of the nearest seen one, so the rows a draft would add are priced at the batch's measured ratio,
    never at the probe's own (cheaper) figure. The result stays non-decreasing in rows."""

    def __init__(self, prior: CostSurface, weight: float = 0.1) -> None:
        self.prior, self.weight = prior, weight
        self.ratio: list[float | None] = [None] * len(prior.rows)
        self.fitted = prior

    def observe(self, rows: int, seconds: float) -> None:
        probed = self.prior(rows)
        if rows <= 0 or probed <= 0 or seconds <= 0:
            return
        r = min(4.0, max(0.25, seconds / probed))  # one stalled pass must not swing the price
        xs = self.prior.rows
        j = next((i for i, x in enumerate(xs) if x >= rows), len(xs) - 1)
        near = [(j, 1.0)] if j == 0 or xs[j] <= rows else [(j - 1, (xs[j] - rows) / (xs[j] - xs[j - 1])),
                                                            (j, (rows - xs[j - 1]) / (xs[j] - xs[j - 1]))]
        for i, share in near:
            old = self.ratio[i]
            if old is None:  # a knot is first set by a pass nearer to it than to its neighbour
                self.ratio[i] = r if share >= 0.5 else None
            else:
                self.ratio[i] = old + self.weight * share * (r - old)
        seen = [i for i, q in enumerate(self.ratio) if q is not None]
        ratios = [self.ratio[min(seen, key=lambda s: abs(s - i))] or 1.0 for i in range(len(xs))]
        self.fitted = CostSurface(xs, tuple(t * q for t, q in zip(self.prior.seconds, ratios)))

    def __call__(self, n: float) -> float:
        return self.fitted(n)


def plan_drafts(gains: list[list[float]], base_rows: int, base_tokens: float, cost: Callable[[int], float],
                draft_cost: Callable[[list[int]], float] | None = None, per_drafting: float = 0.0,
                beside: int = 0, max_drafting: int | None = None, price: float = 1.0) -> list[int]:
    """Draft tokens per sequence that maximise the pass's expected tokens per second.

    gains[i][j]: the expected tokens the (j+1)-th draft node of sequence i adds (non-increasing in j: a
    sequence's nodes are taken best first, so they always form a prefix of its proposal). The m nodes worth
    most are the m largest gains anywhere in the batch, and T depends on the total rows only; so the plan is
    the best m: argmax (E0 + top-m gains) / (T(rows0 + m) + drafting time), looked at over every m, so a bump
    in T (e.g. 1 -> 2 rows on a CPU) does not hide a larger draft that pays. base_rows / base_tokens: rows of
    the pass and tokens it yields with no draft; draft_cost(ks): seconds to draft ks (default none);
    per_drafting: seconds each sequence that drafts adds outside the pass and the drafting (verifying its
    tree, accepting, the drafter following what was kept: StepOverhead), charged as the m nodes bring
    sequences in (the order stays by gain: a near-optimal plan, not an exhaustive one).

    beside: rows of the same pass that are not decoding (a joining prompt's chunk). A draft pays its rows'
    marginal cost in that pass, but is weighed against the decode rate of a pass without them: the chunk's
    seconds earn no decode tokens, so against the whole pass's rate every drafted token would look worth it.

    max_drafting: at most this many sequences draft (the nodes of any other are passed over).

    price: what the seconds drafted rows add to the step (their share of the pass, per_drafting) are multiplied by:
    measured over predicted for the batch's recent drafting passes (pass_calibration). The drafter's own cost is
    its own to measure (a lazy prompt's one-time catch-up would price every later draft as if it recurred).

    Every term of the denominator grows with m, so once even all the remaining gains over the current one
    could not beat the best rate, no larger m can: the scan stops there (a batch of 16 EAGLE trees has ~900
    candidate nodes, and a plan is made every pass).
    """
    order = sorted(((g, i) for i, gs in enumerate(gains) for g in gs if g > 0), key=lambda x: -x[0])
    ks = [0] * len(gains)
    t0 = cost(base_rows)

    def seconds(m: int) -> float:  # the decode rows' share of a pass with m drafted rows
        return t0 + cost(base_rows + beside + m) - cost(base_rows + beside) if beside else cost(base_rows + m)

    best_m, best_rate = 0, base_tokens / t0
    tokens = float(base_tokens)
    drafting = 0
    taken: list[int] = []
    rest = sum(g for g, _ in order)
    for g, i in order:
        rest -= g
        if not ks[i] and max_drafting is not None and drafting >= max_drafting:
            continue
        tokens += g
        drafting += ks[i] == 0
        ks[i] += 1
        taken.append(i)
        m = len(taken)
        spent = t0 + price * (seconds(m) - t0 + per_drafting * drafting) + (draft_cost(ks) if draft_cost else 0.0)
        if tokens / spent > best_rate:
            best_m, best_rate = m, tokens / spent
        elif (tokens + rest) / spent <= best_rate:
            break
    ks = [0] * len(gains)
    for i in taken[:best_m]:
        ks[i] += 1
    return ks


def catch_up_share(behind: int, chain: int, left: int) -> float:
    """Rows of a drafter's catch-up (what it fell behind by while not drafting: a lazy prompt included) beyond one
    chain's worth that a drafting step is charged: spread over the drafting steps the sequence has left (about
    left / chain), since once fed they serve every later draft."""
    return max(0, behind - chain) / max(1.0, left / chain)


PRIOR = 0.6  # per-token acceptance assumed before anything has been verified


def step_weight(weight: float, seen: int) -> float:
    """An EMA's weight for its next observation after `seen`: the prior counts as one observation, so the first
    few observations are averaged with it (1/2, 1/3, ...) until the EMA's own weight is larger. With the plain
    weight (0.15) three verified trees left 61% of the estimate at the prior: an EAGLE head accepted 12% of the
    time was still priced at ~35% once its exploration ended, and the whole batch drafted at a loss."""
    return max(weight, 1.0 / (seen + 2))


@dataclass
class AcceptanceEMA:
    """Running per-token acceptance of one sequence's chains: an EMA over verified chain positions.

    A k-token chain with n accepted tells: positions 1..n accepted, position n+1 rejected (if n < k); the
    j-th drafted token is then worth a^j."""

    a: float = PRIOR
    weight: float = 0.15
    seen: int = 0  # verified positions behind a
    prior: float = PRIOR  # what it drifts back to without evidence (the drafter's measured prior, if it has one)

    def update(self, drafted: int, path: list[int]) -> None:
        trials = [1.0] * len(path) + ([0.0] if len(path) < drafted else [])
        for x in trials:
            self.a += step_weight(self.weight, self.seen) * (x - self.a)
            self.seen += 1

    def gains(self, n: int) -> list[float]:
        return [self.a**j for j in range(1, n + 1)]

    def relax(self, weight: float) -> None:
        """Drift back toward the prior (no draft was verified: nothing was learnt this pass)."""
        self.a += weight * (self.prior - self.a)


@dataclass
class RankAcceptance:
    """Per rank, the chance that a sequence's r-th best draft-tree node is on the accepted path: an EMA over
    its verified trees (nodes best first), a^r before a rank has been seen; never increasing in r."""

    a: float = PRIOR
    weight: float = 0.15
    hits: list[float] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)  # per rank, verified trees behind hits
    prior: float = PRIOR  # what it drifts back to without evidence (rank r: prior^(r+1))

    def update(self, drafted: int, path: list[int]) -> None:
        on = set(path)
        for r in range(drafted):
            if r == len(self.hits):
                self.hits.append(self.a ** (r + 1))
                self.seen.append(0)
            self.hits[r] += step_weight(self.weight, self.seen[r]) * ((1.0 if r in on else 0.0) - self.hits[r])
            self.seen[r] += 1

    def gains(self, n: int) -> list[float]:
        out, low = [], 1.0
        for r in range(n):
            low = min(low, self.hits[r] if r < len(self.hits) else self.a ** (r + 1))
            out.append(low)
        return out

    def relax(self, weight: float) -> None:
        """Drift back toward the prior (no draft was verified: nothing was learnt this pass)."""
        for r, h in enumerate(self.hits):
            self.hits[r] = h + weight * (self.prior ** (r + 1) - h)


@dataclass
class Calibration:
    """Measured over predicted, from decaying sums that start equal (so the factor starts at 1), clamped to
    [lo, hi]: the planner's two corrections of what its estimates miss (gain_calibration, pass_calibration)."""

    predicted: float
    measured: float
    decay: float
    lo: float
    hi: float

    def observe(self, predicted: float, measured: float) -> None:
        if predicted <= 0:  # nothing predicted: nothing to compare
            return
        self.predicted = self.decay * self.predicted + predicted
        self.measured = self.decay * self.measured + max(0.0, measured)

    @property
    def factor(self) -> float:
        return min(self.hi, max(self.lo, self.measured / self.predicted))

    def scaled(self, gains: list[float]) -> list[float]:
        f = self.factor
        return [min(1.0, g * f) for g in gains]


def gain_calibration() -> Calibration:
    """Accepted over expected tokens of a batch's verified drafts (about the last 50), scaling the planner's gains:
    it takes the nodes whose estimates are highest, so their errors are not symmetric there (an EAGLE head at batch
    4, bf16: plans expected 35 tokens where 24 were accepted, and passes that looked 4% faster ran at break-even)."""
    return Calibration(4.0, 4.0, decay=0.98, lo=0.25, hi=1.25)


def pass_calibration() -> Calibration:
    """Measured over predicted seconds that drafted rows added to the recent steps (about the last 10 drafting
    passes), outside the drafting itself, multiplying the planner's price of those rows: the prediction misses a
    tree's verification in Python, longer contexts, a surface extrapolated past its probe (an EAGLE head at batch
    2, bf16, surface probed to 8 rows: rows priced at 2 ms took 30 ms, and the batch ran 3% below AR)."""
    return Calibration(0.01, 0.01, decay=0.9, lo=0.5, hi=4.0)


@dataclass
class StepOverhead:
    """What a sequence that drafts adds to a step outside the forward pass and the drafter's proposals:
    verifying its tree, accepting (compacting its slot) and the drafter following what was kept. Measured
    online from passes without prefill: per sequence in passes where none drafted (base), and over that per
    drafting sequence (extra), each an EMA. Nothing of it is in the cost surface T(rows), and at a few
    sequences a pass it is a real share of a short pass."""

    base: float | None = None
    extra: float = 0.0
    weight: float = 0.1

    def observe(self, seconds: float, n_seqs: int, n_drafting: int) -> None:
        if n_seqs <= 0:
            return
        if not n_drafting:
            per = seconds / n_seqs
            self.base = per if self.base is None else self.base + self.weight * (per - self.base)
        elif self.base is not None:
            per = max(0.0, (seconds - self.base * n_seqs) / n_drafting)
            self.extra += self.weight * (per - self.extra)


@torch.inference_mode()
def measure_cost_surface(lm: LoadedModel, *, n_seqs: int = 8, context: int = 64,
                         sizes: tuple[int, ...] = SURFACE_ROWS, reps: int = 2,
                         rows_per_seq: int = 4) -> CostSurface:
    """Median seconds of a ragged verification pass (logits at every row) of n rows, for each n in sizes:
    chains of about `rows_per_seq` rows (a pending token and its draft) on up to n_seqs sequences with
    `context` cached tokens each. A pass visits every size per round, so a burst of outside load hits
    one round rather than one size."""
    from specledger.decoding.loop.runner import RunItem, ModelRunner
    from specledger.decoding.tree import Tree

    vocab = lm.config.vocab_size
    def spread(n: int) -> int:  # sequences carrying a pass of n rows
        return min(n_seqs, -(-n // rows_per_seq))

    per_seq = max(-(-n // spread(n)) for n in sizes)
    context = max(1, min(context, lm.config.max_seq_len - per_seq - 1))
    runner = ModelRunner(lm, n_seqs, context + per_seq + 1)
    gen = torch.Generator().manual_seed(0)

    def rand(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    seqs = [runner.open(rand(context)) for _ in range(n_seqs)]
    runner.forward([RunItem(s) for s in seqs])
    times: dict[int, list[float]] = {n: [] for n in sizes}
    dev = runner.device
    for rep in range(reps + 1):
        for n in sizes:
            m = spread(n)
            share = [n // m + (1 if j < n % m else 0) for j in range(m)]
            items = []
            for s, r in zip(seqs, share):
                if r:
                    s.tokens.append(rand(1)[0])
                    items.append(RunItem(s, Tree.chain(rand(r - 1))))
            t0 = clock(dev)
            runner.forward(items, all_logits=True)
            t1 = clock(dev)
            if rep:
                times[n].append(t1 - t0)
            for it in items:
                runner.cache.rollback(it.seq.slot, context)
                it.seq.tokens.pop()
    return CostSurface(tuple(sizes), tuple(statistics.median(times[n]) for n in sizes))


def cost_surface(lm: LoadedModel, max_rows: int = SURFACE_ROWS[-1], **probe: Any) -> CostSurface:
    """The model's surface up to max_rows (the next probe size above it included), measured on first use per
    model, precision and device (and probe settings), kept in the model pool, and measured again only for a
    larger max_rows."""
    sizes = tuple(n for n in SURFACE_ROWS if n < max_rows) + tuple(n for n in SURFACE_ROWS if n >= max_rows)[:1]
    name = ("cost_surface", tuple(sorted(probe.items())))
    return POOL.derived(key_of(lm), name, lambda: measure_cost_surface(lm, sizes=sizes, **probe), owner=lm.model,
                        enough=lambda have: have.rows[-1] >= sizes[-1])

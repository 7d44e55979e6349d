"""Decision thresholds: the value of one input (review minutes, fix minutes, wage, volume, hardware price, pass
rate) at which the answer changes, everything else as priced.

The answer at a value is what verdicts.py says there (paired Monte Carlo, a difference only beyond 1% of the cost
with a 95% interval): one configuration "cheapest", a "tie" (every candidate indistinguishable: the decoding
choice does not matter), or "differs" (some verdict is not a tie, but no single configuration is cheapest). A log
grid outward from today's value finds the first change, bisection refines it, and the full sample count confirms
it. Its interval comes from the samples one at a time: the value at which each sample's costs reach the new
answer (the same 1% margin, no interval), read at its 2.5th and 97.5th percentiles. The search reprices only the
configurations in the running (comparable, feasible, finite: these inputs move none of that) at their priced load
level, with fewer samples than the table (`SEARCH_SAMPLES`), the same seed at every value (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specledger.ledger.cost_model import Case, get_value, task_cost, with_value
from specledger.ledger.inputs import Resolved
from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.montecarlo import draw_all
from specledger.ledger.verdicts import MATERIAL, Row, tested_verdicts

SEARCH_SAMPLES = 500  # the first of the table's samples, per value tried during the search (all: to confirm)
BISECTIONS = 8  # a half-decade bracket to within ~1%
TIE, DIFFERS = "tie", "differs"


@dataclass
class Input:
    """One main input: its path in the cost inputs, and how to walk it."""

    path: tuple
    label: str
    unit: str
    kind: str = "scale"  # "scale": >= 0, walked on a log grid; "volume": > 0; "fraction": a pass rate in [0.05, 1]


REVIEW = Input(("acceptance", "review_minutes"), "the review time per task", "min")
INPUTS = (
    REVIEW,
    Input(("acceptance", "fix_minutes"), "the fix time per escalated task", "min"),
    Input(("acceptance", "wage_per_hour"), "the wage", "$/h"),
    Input(("volume", "tasks_per_month"), "the volume", "tasks/month", "volume"),
    Input(("hardware", "price_per_device_hour"), "the hardware price", "$/device-h"),
    Input(("acceptance", "pass_rate"), "the pass rate (of every configuration)", "", "fraction"),
)
OWNED_PRICE = Input(("hardware", "purchase_price"), "the purchase price per device", "$")


@dataclass
class Crossing:
    """Where the answer changes along one input (see the module docstring)."""

    input: Input
    current: float
    value: float | None  # None: no change within [searched_low, searched_high]
    low: float | None
    high: float | None
    side: str  # "below" | "above"
    before: str
    after: str
    searched_low: float
    searched_high: float


@dataclass
class _Row:
    """A candidate re-priced at another input value (verdicts.Row)."""

    name: str
    total: float | None
    ttft_p95: float | None
    e2e_p95: float | None
    comparable: bool = True
    comparable_reason: str = ""
    infinite: bool = False
    feasible: bool = True
    misses: list[str] = field(default_factory=list)
    verdict: str = ""
    verdict_detail: str = ""


def state_of(rows: Sequence[Row]) -> str:
    """The answer the verdicts give: the one "cheapest" configuration, TIE, or DIFFERS."""
    best = [r.name for r in rows if r.verdict == "cheapest"]
    if best:
        return best[0]
    return TIE if all(r.verdict == "indistinguishable" for r in rows) else DIFFERS


class Search:
    """The candidates of one scenario, re-priced at changed values of one input at a time, on the very draws the
    table's Monte Carlo priced (so at today's value the answer is the table's)."""

    def __init__(self, candidates: Sequence[tuple[Row, Case, Resolved, ConfigMeasurement]],
                 priced: Sequence[tuple[Case, Resolved, ConfigMeasurement]], samples: int, seed: int = 0):
        """`priced`: every case the table's Monte Carlo sampled, in its order (the draws depend on it)."""
        self.rows = [c[0] for c in candidates]
        self.cases = [(c[1], c[2], c[3]) for c in candidates]
        self.n, self.seed = samples, seed
        drawn = dict(zip((c.name for c, _, _ in priced), draw_all(list(priced), samples, seed)))
        self.drawn = [drawn[c.name] for c, _, _ in self.cases]

    def current(self, inp: Input) -> float | None:
        """The input's central value now (the first candidate's; the pass rate: its measured one if none given)."""
        case = self.cases[0][0]
        v = get_value(case.x, inp.path)
        if v is None and inp.path == ("acceptance", "pass_rate"):
            v = case.op.pass_rate
        return None if v is None else float(v)

    def costs(self, path: tuple, v) -> np.ndarray:
        """Cost samples (candidates x samples) with the input at v (a number, or one value per sample)."""
        return np.vstack([np.broadcast_to(np.asarray(task_cost(with_value(x, path, v), op).total, dtype=np.float64),
                                          (self.n,)) for x, op in self.drawn])

    def points(self, path: tuple, v: float) -> list[float]:
        return [float(task_cost(with_value(c.x, path, v), c.op).total) for c, _, _ in self.cases]

    def state(self, path: tuple, v: float, n: int = SEARCH_SAMPLES) -> str:
        """The verdicts' answer with the input at v, from the first n samples."""
        rows: list[Row] = [_Row(r.name, t, r.ttft_p95, r.e2e_p95) for r, t in zip(self.rows, self.points(path, v))]
        c = self.costs(path, v)[:, :n]
        tested_verdicts(rows, {r.name: c[i] for i, r in enumerate(rows)})
        return state_of(rows)

    def sample_state_is(self, c: np.ndarray, before: str, after: str) -> np.ndarray:
        """Per sample (columns of c): whether its costs alone, with the same 1% margin, give `after` rather than
        `before`."""
        lo = c.min(axis=0)
        tie = c.max(axis=0) - lo <= MATERIAL * lo
        if after == TIE:
            return tie
        if after == DIFFERS or before == TIE:
            return ~tie if before == TIE else ~self._clear(c, before)
        return self._clear(c, after)

    def _clear(self, c: np.ndarray, name: str) -> np.ndarray:
        i = [r.name for r in self.rows].index(name)
        others = np.delete(c, i, axis=0)
        return np.all(others > (1 + MATERIAL) * c[i], axis=0) if others.size else np.ones(c.shape[1], bool)


def grid(inp: Input, current: float) -> tuple[list[float], list[float]]:
    """Values to try below and above today's, nearest first (half-decade steps on the log grids)."""
    if inp.kind == "fraction":
        down = [v for v in np.arange(current - 0.05, 0.0499, -0.05)] + ([0.05] if current > 0.05 else [])
        up = [v for v in np.arange(current + 0.05, 1.0001, 0.05)] + ([1.0] if current < 1.0 else [])
        return sorted(set(map(float, down)), reverse=True), sorted(set(map(float, up)))
    if current <= 0:  # nothing below; above, from a second of work (or a cent) up
        return [], [float(v) for v in 10.0 ** np.arange(-3.0, 2.01, 0.5)]
    down = [current * 10 ** (-k / 2) for k in range(1, 9)] + ([0.0] if inp.kind == "scale" else [])
    up = [current * 10 ** (k / 2) for k in range(1, 5)]
    return down, up


def _mid(a: float, b: float) -> float:
    """Bisect in log space between two positive values (halves a decade evenly), else linearly."""
    return float(np.sqrt(a * b)) if a > 0 and b > 0 else (a + b) / 2


def find(search: Search, inp: Input) -> Crossing | None:
    """The nearest value, below or above today's, at which the answer changes (None: no current value). The grid
    is walked on the first SEARCH_SAMPLES samples; a change is confirmed, and bisected, on all of them."""
    now = search.current(inp)
    if now is None:
        return None
    path, full = inp.path, search.n
    before = search.state(path, now, full)  # the table's verdicts
    down, up = grid(inp, now)
    found: list[tuple[float, float, str, str]] = []  # (distance, value, side, after)
    for side, values in (("below", down), ("above", up)):
        prev = now
        for v in values:
            after = search.state(path, v)
            if after != before:  # a change on the first samples: does it hold on all?
                after = search.state(path, v, full)
            if after == before:
                prev = v
                continue
            inside, outside = prev, v
            for _ in range(BISECTIONS):
                mid = _mid(inside, outside)
                if search.state(path, mid, full) == after:
                    outside = mid
                else:
                    inside = mid
            dist = abs(outside - now) if inp.kind == "fraction" else abs(np.log10(max(outside, 1e-9) / max(now, 1e-9)))
            found.append((float(dist), outside, side, after))
            break
    lo_s, hi_s = min(down, default=now), max(up, default=now)
    if not found:
        return Crossing(inp, now, None, None, None, "", before, before, lo_s, hi_s)
    _, value, side, after = min(found)
    low, high = interval(search, inp, now, down if side == "below" else up, before, after)
    return Crossing(inp, now, value, low, high, side, before, after, lo_s, hi_s)


def interval(search: Search, inp: Input, now: float, values: list[float], before: str,
             after: str) -> tuple[float | None, float | None]:
    """2.5th and 97.5th percentiles over the samples of where each sample's costs first give `after` along
    `values` (refined by per-sample bisection); a bound is None where too few samples get there."""
    path, n = inp.path, search.n
    walk = [now] + values
    inside = np.full(n, np.nan)  # last value still `before`, per sample
    outside = np.full(n, np.nan)  # first value giving `after`
    prev = None
    for v in walk:
        reached = search.sample_state_is(search.costs(path, v), before, after)
        new = reached & np.isnan(outside)
        outside[new] = v
        inside[new] = v if prev is None else prev
        prev = v
    hit = ~np.isnan(outside)
    if hit.any():
        a, b = inside[hit].copy(), outside[hit].copy()
        for _ in range(BISECTIONS):
            mid = np.where((a > 0) & (b > 0), np.sqrt(np.abs(a * b)), (a + b) / 2)
            full = np.full(n, now, dtype=np.float64)
            full[hit] = mid
            ok = search.sample_state_is(search.costs(path, full), before, after)[hit]
            b = np.where(ok, mid, b)
            a = np.where(ok, a, mid)
        outside[hit] = b
    # samples that never get there cross beyond the walk: +-inf on the walk's side
    far = -np.inf if values and values[-1] < now else np.inf
    x = np.where(hit, outside, far)
    p = np.quantile(x, [0.025, 0.975], method="inverted_cdf")  # no interpolation: +-inf stays a bound
    lo, hi = (float(v) if np.isfinite(v) else None for v in sorted(p))
    return lo, hi


def curve(search: Search, inp: Input, values: list[float]) -> list[tuple[str, list[tuple]]]:
    """Each candidate's cost per task at each value: (config, [(value, central, 5th pct, 95th pct)])."""
    out: list[tuple[str, list[tuple]]] = [(r.name, []) for r in search.rows]
    for v in values:
        c = search.costs(inp.path, v)
        pts = search.points(inp.path, v)
        for i, (_, series) in enumerate(out):
            fin = c[i][np.isfinite(c[i])]
            p5, p95 = (float(np.percentile(fin, 5)), float(np.percentile(fin, 95))) if fin.size else (None, None)
            series.append((v, pts[i] if np.isfinite(pts[i]) else None, p5, p95))
    return out

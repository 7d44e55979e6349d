"""Decision thresholds: the value of one input (review minutes, fix minutes, wage, volume, hardware price, pass
rate) at which the answer changes, everything else as priced.

The answer at a value is what verdicts.py says there (paired Monte Carlo, a difference only beyond 1% of the cost
with a 95% interval): one configuration "cheapest", a "tie" (every candidate indistinguishable: the decoding
choice does not matter), or "differs" (some verdict is not a tie, but no single configuration is cheapest). A log
grid outward from today's value finds the first change, bisection refines it, and the full sample count confirms
it. Its interval comes from the samples one at a time: the value at which each sample's gap between the two
configurations that decide the change crosses the same 1% margin, read at its 2.5th and 97.5th percentiles (the
verdict, sure at 95%, changes near one end of it). The search reprices only the
configurations in the running (comparable, feasible, finite: these inputs move none of that) at their priced load
level, with fewer samples than the table (`SEARCH_SAMPLES`), the same seed at every value (common random numbers).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specledger.ledger.cost_model import Case, get_value, task_cost, with_value
from specledger.ledger.inputs import Resolved
from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.montecarlo import draw_all
from specledger.ledger.verdicts import MATERIAL, Row, tested_verdicts

SEARCH_SAMPLES = 500  # the first of the table's samples, per value tried during the search (all: to confirm)
BISECTIONS = 10  # a decade's bracket to within ~0.5% (log-space halving)
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
        """The verdicts' answer with the input at v, from the first n samples: the one "cheapest" configuration,
        TIE, or DIFFERS."""
        rows: list[Row] = [copy.copy(r) for r in self.rows]  # the candidates re-priced (they are in the running)
        for r, t in zip(rows, self.points(path, v)):
            r.total, r.verdict, r.verdict_detail = t, "", ""
        c = self.costs(path, v)[:, :n]
        tested_verdicts(rows, {r.name: c[i] for i, r in enumerate(rows)})
        best = next((r.name for r in rows if r.verdict == "cheapest"), None)
        return best if best is not None else TIE if all(r.verdict == "indistinguishable" for r in rows) else DIFFERS

    def names(self) -> list[str]:
        return [r.name for r in self.rows]

    def pair(self, path: tuple, v: float, first: str | None = None, *, closest: bool = False) -> tuple[int, int]:
        """The two candidates that decide the answer at v: `first` (default: the lowest central cost) and the one
        most clearly apart from it (largest 2.5th percentile of the paired difference), or, with `closest`,
        the one nearest to it (smallest mean difference)."""
        pts = self.points(path, v)
        i = self.names().index(first) if first is not None else int(np.argmin(pts))
        c = self.costs(path, v)
        d = np.delete(c - c[i], i, axis=0)
        key = d.mean(axis=1) if closest else -np.percentile(d, 2.5, axis=1)
        j = int(np.argmin(key))
        return i, j + (j >= i)


def separated(c: np.ndarray, a: int, b: int) -> np.ndarray:
    """Per sample: b costs more than a by over the material margin (verdicts.MATERIAL) of a's cost."""
    return c[b] - c[a] > MATERIAL * c[a]


def gaps_move(search: Search, path: tuple, now: float, value: float) -> bool:
    """Whether moving the input from `now` to `value` changes any candidate's cost gap to the others, in dollars, in
    any draw. An input that adds the same dollars to every configuration (review minutes do) moves none: a crossing
    along it comes only from the relative margin, a fixed gap becoming a smaller or larger share of the cost."""
    a, b = search.costs(path, now), search.costs(path, value)
    scale = float(np.nanmax(np.abs(np.where(np.isfinite(a), a, np.nan)))) if np.isfinite(a).any() else 1.0
    return not np.allclose(a - a[0], b - b[0], rtol=1e-9, atol=1e-12 * scale, equal_nan=True)


def grid(inp: Input, current: float) -> tuple[list[float], list[float]]:
    """Values to try below and above today's, nearest first (decades on the log grids: bisection does the rest)."""
    if inp.kind == "fraction":
        down = [v for v in np.arange(current - 0.05, 0.0499, -0.05)] + ([0.05] if current > 0.05 else [])
        up = [v for v in np.arange(current + 0.05, 1.0001, 0.05)] + ([1.0] if current < 1.0 else [])
        return sorted(set(map(float, down)), reverse=True), sorted(set(map(float, up)))
    if current <= 0:  # nothing below; above, from a second of work (or a cent) up
        return [], [float(v) for v in 10.0 ** np.arange(-3.0, 2.01)]
    down = [current * 10.0 ** -k for k in range(1, 5)] + ([0.0] if inp.kind == "scale" else [])
    up = [current * 10.0 ** k for k in range(1, 3)]
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
    low, high = interval(search, inp, now, down if side == "below" else up, value, before, after)
    return Crossing(inp, now, value, low, high, side, before, after, lo_s, hi_s)


def reached(search: Search, inp: Input, now: float, value: float, before: str,
            after: str) -> tuple[int, int, bool]:
    """The pair whose gap decides the change, and whether `after` means it is apart (True) or together (False)."""
    p = inp.path
    if before == TIE:  # it starts to matter: the pair that is apart past the threshold
        return (*search.pair(p, value), True)
    if after == TIE:  # it stops mattering: the pair that was apart before it
        return (*search.pair(p, now), False)
    if before == DIFFERS:  # after: one configuration clear of its nearest rival
        return (*search.pair(p, value, after, closest=True), True)
    if after == DIFFERS:  # the clear choice meets its nearest rival
        return (*search.pair(p, value, before, closest=True), False)
    return search.names().index(after), search.names().index(before), True  # one clear choice gives way to another


def interval(search: Search, inp: Input, now: float, values: list[float], value: float, before: str,
             after: str) -> tuple[float | None, float | None]:
    """2.5th and 97.5th percentiles over the samples of where, along `values`, each sample's gap between the
    deciding pair (see `reached`) crosses the 1% margin (refined by per-sample bisection); a bound is None where
    too few samples cross within the range searched."""
    path, n = inp.path, search.n
    a, b, apart = reached(search, inp, now, value, before, after)

    def there(v) -> np.ndarray:
        sep = separated(search.costs(path, v), a, b)
        return sep if apart else ~sep

    inside = np.full(n, np.nan)  # last value still before the crossing, per sample
    outside = np.full(n, np.nan)  # first value past it
    for prev, v in zip([now, now, *values], [now, *values]):  # today's value, then the walk
        new = there(v) & np.isnan(outside)
        outside[new], inside[new] = v, prev
    hit = ~np.isnan(outside)
    if hit.any():
        lo, hi = inside[hit].copy(), outside[hit].copy()
        for _ in range(BISECTIONS):
            mid = np.where((lo > 0) & (hi > 0), np.sqrt(np.abs(lo * hi)), (lo + hi) / 2)
            full = np.full(n, now, dtype=np.float64)
            full[hit] = mid
            ok = there(full)[hit]
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid)
        outside[hit] = hi
    # samples that never cross do so beyond the walk: +-inf on the walk's side
    far = -np.inf if values and values[-1] < now else np.inf
    x = np.where(hit, outside, far)
    p = np.quantile(x, [0.025, 0.975], method="inverted_cdf")  # no interpolation: +-inf stays a bound
    low, high = (float(v) if np.isfinite(v) else None for v in sorted(p))
    return low, high


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

"""Verdicts: which configuration is cheapest, which are dominated, and which cannot be told apart.

A configuration is "cheapest" only when the 95% interval of its cost difference with every other
candidate lies beyond a material difference (MATERIAL, a share of the cheaper one's cost per task), and
"dominated" only when some other configuration is cheaper by such an interval and is no slower.
Candidates whose difference with the cheapest is not that clear are "indistinguishable". An interval
that merely excludes zero would split an A/A pair in about 5% of runs (more with few prompts, where a
bootstrap interval is too narrow); a difference of under 1% of the cost per task is not a verdict worth
naming anyway (with a person reviewing every task, decoding choices often move the cost by less).
The differences come from Monte Carlo samples drawn with common random numbers (ledger/montecarlo.py),
so they are paired.

Without samples (--samples 0, and the page's calculator) only point estimates exist: the point
verdicts below say what the central values give, and nothing about noise.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from specledger.ledger.paired import Difference, difference


class Row(Protocol):  # the fields of ledger.price.ConfigCost used here
    name: str
    comparable: bool
    comparable_reason: str
    infinite: bool
    feasible: bool
    misses: list[str]
    total: float | None
    ttft_p95: float | None
    e2e_p95: float | None
    verdict: str
    verdict_detail: str


def _status(r: Row) -> bool:
    """Rows that are out of the running get their reason; returns whether r is a candidate."""
    if not r.comparable:
        r.verdict, r.verdict_detail = "not comparable", r.comparable_reason
    elif r.infinite:
        r.verdict, r.verdict_detail = "infinite cost", "pass rate 0: no attempt is ever accepted"
    elif not r.feasible:
        r.verdict, r.verdict_detail = "infeasible", "; ".join(r.misses)
    else:
        return r.total is not None
    return False


def _total(r: Row) -> float:
    """A candidate's total (_status admits only rows that have one)."""
    assert r.total is not None
    return r.total


MATERIAL = 0.01  # a cost difference under 1% of the cheaper configuration's cost per task is no difference


def _separated(d: Difference | None, scale: float) -> bool:
    """The difference's 95% interval lies beyond +-MATERIAL x scale (the cheaper one's cost per task)."""
    margin = MATERIAL * abs(scale)
    return d is not None and (d.low > margin or d.high < -margin)


def _no_slower(o: Row, r: Row) -> bool:
    def no_worse(a, b):
        return a is not None and b is not None and a <= b

    return no_worse(o.ttft_p95, r.ttft_p95) and no_worse(o.e2e_p95, r.e2e_p95)


def point_verdicts(rows: list[Row]) -> None:
    """From central values only (what calculator.js does on the page)."""
    eligible = [r for r in rows if _status(r)]
    cheapest = min(eligible, key=_total, default=None)
    if cheapest is None:
        return
    for r in eligible:
        if r is cheapest:
            r.verdict, r.verdict_detail = "cheapest", ""
            continue
        better = [o for o in eligible if o is not r and _total(o) <= _total(r) and _no_slower(o, r)]
        if better:
            r.verdict, r.verdict_detail = "dominated", f"by {better[0].name}: cheaper and no slower"
        else:
            pct = 100 * (_total(r) / _total(cheapest) - 1)
            r.verdict, r.verdict_detail = "trade-off", f"+{pct:.1f}% vs {cheapest.name}, but faster"


def _money(d: float) -> str:
    return f"{'-' if d < 0 else '+'}${abs(d):.3g}"


def signed_pct(v: float) -> str:
    """A share with its sign, two significant figures below 10%: "-5.3%", "+21%", "+0.31%"."""
    return f"{100 * v:+.0f}%" if abs(v) >= 0.1 else f"{100 * v:+.2g}%"


def _apart(name: str, best: Row, d: Difference) -> str:
    """"ar-w8 - ar-w4: -$0.096 to +$0.393 per task (-5.3% to +21%, 95%)": what the interval holds, in both units."""
    scale = _total(best)
    pct = f"{signed_pct(d.low / scale)} to {signed_pct(d.high / scale)}, " if scale > 0 else ""
    return f"{name} - {best.name}: {_money(d.low)} to {_money(d.high)} per task ({pct}95%)"


def tested_verdicts(rows: list[Row], costs: dict[str, np.ndarray]) -> None:
    """Verdicts from paired cost samples (name -> samples, aligned across configurations)."""
    eligible = [r for r in rows if _status(r)]
    if not eligible:
        return
    missing = [r for r in eligible if r.name not in costs]
    if missing:  # cannot test what was not sampled
        point_verdicts(rows)
        return
    best = min(eligible, key=_total)
    diffs = {r.name: difference(costs[r.name], costs[best.name]) for r in eligible if r is not best}
    ties = [r for r in eligible if r is not best and not _separated(diffs[r.name], _total(best))]
    if not ties:
        best.verdict = "cheapest"
        closest = min((d for d in diffs.values() if d is not None), key=lambda d: d.low, default=None)
        best.verdict_detail = ("" if closest is None else
                               f"every other costs more per task, by at least {_money(closest.low)[1:]} (95%; "
                               f"differences under {MATERIAL:.0%} of the cost count as none)")
    else:
        group = [best] + ties
        for r in group:  # each names the differences it cannot tell apart from the cheapest: "cannot be told apart"
            others = ", ".join(o.name for o in group if o is not r)
            spans = [_apart(t.name, best, d) for t in (ties if r is best else [r]) if (d := diffs[t.name]) is not None]
            r.verdict, r.verdict_detail = "indistinguishable", f"from {others}" + "".join(f"; {s}" for s in spans)
    for r in eligible:
        if r.verdict == "indistinguishable" or r is best:
            continue
        better = [(o, d) for o in eligible if o is not r and _no_slower(o, r)
                  and (d := difference(costs[r.name], costs[o.name])) is not None and d.low > MATERIAL * _total(o)]
        if better:
            o, d = min(better, key=lambda od: _total(od[0]))
            r.verdict, r.verdict_detail = "dominated", (f"by {o.name}: {_money(d.low)[1:]} to {_money(d.high)[1:]} "
                                                        "cheaper per task (95%) and no slower")
        else:
            d = diffs[r.name]
            assert d is not None  # r is not a tie, so its difference exists
            r.verdict = "trade-off"
            r.verdict_detail = f"{_money(d.low)} to {_money(d.high)} per task vs {best.name} (95%), but faster"
        # the rows out of the cheapest group that cannot be told apart from r (an A/A pair among them)
        peers = [o.name for o in eligible if o is not r and o is not best and o not in ties
                 and not _separated(difference(costs[r.name], costs[o.name]), min(_total(r), _total(o)))]
        if peers:
            r.verdict_detail += f"; indistinguishable from {', '.join(peers)}"

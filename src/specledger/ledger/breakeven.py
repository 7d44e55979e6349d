"""Break-even: the value of one input at which two configurations cost the same per accepted task.

Fields: "pass_rate" and "device_seconds_per_call" (of configuration A only: how far may A's
quality or speed move), "concurrency" (A's operating point along its measured sweep, throughput
interpolated between levels; B's too when B was swept, so both are compared at the same concurrency and only
within the levels both measured: B fixed at its priced level would make a method that is faster at every level
"cheaper above" the level where it overtakes B's best), or any inputs path such as "acceptance.review_minutes" or
"hardware.price_per_device_hour" (changed for both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np
from scipy.optimize import brentq

from specledger.errors import BadInput
from specledger.ledger.cost_model import Case, get_value, task_cost, with_value

MEASURED = ("pass_rate", "device_seconds_per_call", "concurrency")


@dataclass
class BreakEven:
    config_a: str
    config_b: str
    field: str
    current: float | None  # the field's value now (A's, for measured fields)
    value: float | None  # where A and B cost the same; None: no crossing within [lo, hi]
    lo: float
    hi: float
    note: str


def _path(field: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in field.split("."))


def _current(a: Case, field: str) -> float | None:
    if field == "pass_rate":
        q = a.x["acceptance"]["pass_rate"]
        # a priced Case holds measured point values (arrays of draws exist only in Monte Carlo copies)
        return cast(float | None, a.op.pass_rate) if q is None else q
    if field == "device_seconds_per_call":
        return cast(float, a.op.device_seconds_per_call)  # a point value, as above
    if field == "concurrency":
        return a.concurrency
    try:
        v = get_value(a.x, _path(field))
    except (KeyError, IndexError, TypeError):
        raise BadInput(f"break-even field '{field}': no such input (use a dotted path like acceptance.review_minutes, or one of {', '.join(MEASURED)})") from None
    if v is None or isinstance(v, (bool, str)):
        raise BadInput(f"break-even field '{field}': not a number in these inputs")
    return float(v)


def _cost_at(case: Case, field: str, v: float, is_a: bool) -> float:
    if field in MEASURED:
        if not is_a and not (field == "concurrency" and len(case.sweep) >= 2):
            return task_cost(case.x, case.op).total
        if field == "pass_rate":
            if case.x["acceptance"]["pass_rate"] is not None:
                return task_cost(with_value(case.x, ("acceptance", "pass_rate"), v), case.op).total
            return task_cost(case.x, case.with_op(pass_rate=v).op).total
        if field == "device_seconds_per_call":
            return case.with_device_seconds(v).cost().total
        conc, rps = zip(*sorted(case.sweep))
        r = np.interp(v, conc, rps)
        return task_cost(case.x, case.with_op(device_seconds_per_call=case.op.device_count / r, requests_per_s=r).op).total
    return task_cost(with_value(case.x, _path(field), v), case.op).total


def default_bounds(a: Case, field: str, current: float | None) -> tuple[float, float]:
    if field == "pass_rate":
        return 1e-6, 1.0
    if field == "concurrency":
        conc = [c for c, _ in a.sweep]
        return min(conc), max(conc)
    if field in ("hardware.utilisation",):
        return 1e-3, 1.0
    c = current or 0.0
    return (1e-9 if field in ("volume.tasks_per_month", "hardware.lifetime_years") else 0.0), max(10.0 * c, 1.0)


def break_even(a: Case, b: Case, field: str, lo: float | None = None, hi: float | None = None, *,
               grid: int = 200) -> BreakEven:
    """Solve cost_A(v) = cost_B(v) for v in [lo, hi]: a grid finds the first sign change, brentq refines it."""
    if field == "concurrency" and len(a.sweep) < 2:
        raise BadInput(f"break-even on concurrency needs a concurrency sweep of {a.name} (it has {len(a.sweep)} level)")
    current = _current(a, field)
    d_lo, d_hi = default_bounds(a, field, current)
    both = field == "concurrency" and len(b.sweep) >= 2  # B moves along its sweep too: the levels both measured
    if both:
        d_lo, d_hi = max(d_lo, min(c for c, _ in b.sweep)), min(d_hi, max(c for c, _ in b.sweep))
        if not d_lo < d_hi:
            raise BadInput(f"break-even on concurrency: {a.name} and {b.name} share no range of measured levels")
    lo = d_lo if lo is None else lo
    hi = d_hi if hi is None else hi
    if not lo < hi:
        raise BadInput(f"break-even bounds for '{field}': low {lo:g} must be below high {hi:g}")

    def diff(v):
        ca, cb = _cost_at(a, field, v, True), _cost_at(b, field, v, False)
        with np.errstate(invalid="ignore"):
            return np.asarray(ca) - np.asarray(cb) if np.ndim(v) else float(ca - cb)

    xs = np.linspace(lo, hi, grid)
    ys = np.broadcast_to(np.asarray(diff(xs), dtype=np.float64), xs.shape).tolist()  # the model is vectorised
    for i in range(len(xs) - 1):
        y0, y1 = ys[i], ys[i + 1]
        if not (math.isfinite(y0) and math.isfinite(y1)):
            continue
        if y0 == 0 and i > 0:  # a tie at the lower bound alone is not a crossing
            return BreakEven(a.name, b.name, field, current, float(xs[i]), lo, hi, "equal cost")
        if y0 * y1 < 0:
            v = brentq(diff, float(xs[i]), float(xs[i + 1]), xtol=1e-12, rtol=1e-10)
            cheaper_below = y0 < 0
            side = "below" if cheaper_below else "above"
            return BreakEven(a.name, b.name, field, current, float(v), lo, hi,
                             f"{a.name} is cheaper {side} {v:.4g}, {b.name} {'above' if cheaper_below else 'below'}"
                             + (" (both at that concurrency)" if both else ""))
    finite = [y for y in ys if math.isfinite(y)]
    if not finite:
        note = "cost is infinite across the range"
    elif all(abs(y) < 1e-12 for y in finite):
        note = f"equal cost across [{lo:.4g}, {hi:.4g}]"
    elif all(y <= 0 for y in finite):
        note = f"{a.name} is cheaper across [{lo:.4g}, {hi:.4g}]"
    else:
        note = f"{b.name} is cheaper across [{lo:.4g}, {hi:.4g}]"
    if both:
        note += " (both at the same concurrency)"
    return BreakEven(a.name, b.name, field, current, None, lo, hi, note)

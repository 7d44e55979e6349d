"""Where speculation stops paying: each configuration's speed-up over autoregressive decoding of the same
target and precision at every measured concurrency, and the break-even concurrency at which it crosses 1.

Speculation spends compute the batch could have used, so its speed-up falls as concurrency grows; the
crossing is read off the measured sweep, interpolated linearly in log2(concurrency) between the two levels
that straddle 1. Its interval comes the same way from the paired 95% bounds of the speed-up at each level
(the low bound crosses 1 first, the high bound last); a bound that never crosses within the sweep is open
("≤ lowest" or "≥ highest" level measured). Every configuration is treated alike: one that serves a request
at a time simply shows its queue in its throughput.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

from pydantic import BaseModel, Field


class LevelRow(Protocol):  # the fields of ledger.price.ConfigCost read here
    name: str
    strategy: str
    precision: str
    load: str
    concurrency: int | None
    tok_s: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    speedup_base: str | None


class SweepPoint(BaseModel):
    concurrency: int
    tok_s: float | None = None
    speedup: float | None = None
    low: float | None = None  # paired 95% interval of the speed-up
    high: float | None = None


class ConcurrencyBreakEven(BaseModel):
    """One speculative configuration along the concurrency sweep."""

    config: str
    strategy: str
    precision: str
    base: str | None = None  # the autoregressive configuration of the same target and precision
    points: list[SweepPoint] = Field(default_factory=list)
    value: float | None = None  # concurrency where the speed-up crosses 1 (None: no crossing in the sweep)
    low: float | None = None  # earliest crossing the paired intervals allow (None: at or below the lowest level)
    high: float | None = None  # latest (None: at or beyond the highest level)
    status: str = ""  # "pays throughout" | "never pays" | "stops paying" | "starts paying" (value: where it does)
    note: str = ""


def _crossing(cs: Sequence[int], ys: Sequence[float | None], up: bool = False) -> float | None:
    """First concurrency where y goes from >= 1 to < 1 (`up`: from < 1 to >= 1), log2-linear between levels, else
    None (None in ys: not measured)."""
    for (c0, y0), (c1, y1) in zip(zip(cs, ys), zip(cs[1:], ys[1:])):
        if y0 is None or y1 is None:
            continue
        if (y1 >= 1.0 > y0) if up else (y0 >= 1.0 > y1):
            f = (y0 - 1.0) / (y0 - y1)
            return 2 ** (math.log2(c0) + f * (math.log2(c1) - math.log2(c0)))
    return None


def _fmt(c: float) -> str:
    return f"{c:.3g}"


def _interval(b: ConcurrencyBreakEven, cs: Sequence[int]) -> str:
    """" (95%: 1.4 to 2.8)", an end open where its bound does not cross within the sweep."""
    lo = "≤ " + _fmt(cs[0]) if b.low is None else _fmt(b.low)
    return f" (95%: {lo} to {'≥ ' + _fmt(cs[-1]) if b.high is None else _fmt(b.high)})"


def break_even_concurrency(levels: Sequence[LevelRow]) -> list[ConcurrencyBreakEven]:
    """For every non-autoregressive configuration measured at two or more concurrencies with a speed-up."""
    by_name: dict[str, list[LevelRow]] = {}
    for r in levels:
        if r.concurrency is not None and r.strategy != "ar":
            by_name.setdefault(r.name, []).append(r)
    out = []
    for name, rows in by_name.items():
        rows = sorted(rows, key=lambda r: r.concurrency or 0)
        pts = [SweepPoint(concurrency=r.concurrency or 0, tok_s=r.tok_s, speedup=r.speedup, low=r.speedup_low,
                          high=r.speedup_high) for r in rows]
        measured = [p for p in pts if p.speedup is not None]
        if len(measured) < 2:
            continue
        cs = [p.concurrency for p in measured]
        ys = [p.speedup or 0.0 for p in measured]  # (measured: every speed-up is set)
        b = ConcurrencyBreakEven(config=name, strategy=rows[0].strategy, precision=rows[0].precision,
                                 base=next((r.speedup_base for r in rows if r.speedup_base), None), points=pts)
        b.value = _crossing(cs, ys)
        lows, highs = [p.low for p in measured], [p.high for p in measured]
        has_ci = all(v is not None for v in lows + highs)
        if has_ci:  # a bound that never crosses (the low one already under 1 at the first level): open
            b.low, b.high = _crossing(cs, lows), _crossing(cs, highs)
        lo_c, hi_c = cs[0], cs[-1]
        faster = ys[0] >= 1.0
        if all((y >= 1.0) == faster for y in ys):  # one side of 1 throughout: no break-even in the sweep
            b.status = "pays throughout" if faster else "never pays"
            sure = all((v or 0.0) > 1.0 for v in lows) if faster else all((v or 0.0) < 1.0 for v in highs)
            b.note = (f"{'faster' if faster else 'slower'} than {b.base or 'autoregressive'} at every concurrency "
                      f"measured ({lo_c}–{hi_c})" + ("" if sure or not has_ci else "; not distinguishable from 1 at "
                      "some levels") + ": no break-even within the levels measured (if there is one, it is "
                      + (f"above {hi_c})" if faster else f"below {lo_c})"))
        elif b.value is not None:
            b.status = "stops paying"
            b.note = f"speed-up crosses 1 at concurrency ≈ {_fmt(b.value)}{_interval(b, cs) if has_ci else ''}"
        else:  # slower at low concurrency, faster at high: where it starts paying (the high bound crosses first)
            b.status = "starts paying"
            b.value = _crossing(cs, ys, up=True)
            if has_ci:
                b.low, b.high = _crossing(cs, highs, up=True), _crossing(cs, lows, up=True)
            b.note = (f"slower at low concurrency, faster at high: speed-up crosses 1 upwards at concurrency "
                      f"≈ {_fmt(b.value or 0.0)}{_interval(b, cs) if has_ci else ''}")
        out.append(b)
    return out

"""Which inputs move the answer most: one at a time to its low and high end, the rest at centre.

Ranged inputs swing over their range; point inputs over +-20% (labelled so); the measured pass
rate over its 90% Beta interval and the measured device time over its 90% bootstrap interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.stats import beta

from specledger.ledger.inputs import Resolved, leaves
from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.cost_model import Case, task_cost, with_value

POINT_SWING = 0.2
_SKIP = {("acceptance", "retries"), ("hardware", "device_count")}
_FRACTIONS = {("hardware", "utilisation"), ("acceptance", "pass_rate")}


@dataclass
class Swing:
    label: str
    path: str
    low: float
    high: float
    cost_low: float
    cost_high: float
    basis: str  # "range", "±20%", "measured 90%"

    @property
    def swing(self) -> float:
        return abs(self.cost_high - self.cost_low)


def _label(x: dict, path: tuple) -> str:
    if path[:2] == ("task", "tools"):
        return f"{x['task']['tools'][path[2]]['name']} {path[3]}"
    return ".".join(str(p) for p in path)


def _one_tool(x: dict, i: int, totals: tuple[float, float]) -> dict:
    """The inputs with every tool but tool i summed into one: tools add up (calls x price, calls x latency), so a
    swing of tool i costs the same, and pricing each of N tools' swings is linear in N rather than quadratic
    (5,000 tools took over 120 s). `totals`: all tools' calls x price and calls x latency."""
    t = x["task"]["tools"][i]
    rest = {"name": "(the other tools)", "calls": 1.0, "price": totals[0] - t["calls"] * t["price"],
            "latency_s": totals[1] - t["calls"] * t["latency_s"]}
    return with_value(x, ("task", "tools"), [t, rest])


def _measured(label: str, path: str, lo: float, hi: float, at: Callable[[float], Case]) -> Swing:
    """A measured figure swung over its 90% interval (`at`: the case with the figure at a value)."""
    return Swing(label, path, lo, hi, at(lo).cost().total, at(hi).cost().total, "measured 90%")


def sensitivity(case: Case, resolved: Resolved, m: ConfigMeasurement, *, seed: int = 0) -> list[Swing]:
    """Swings of cost per accepted task for one configuration, largest first."""
    base = task_cost(case.x, case.op).total
    if not math.isfinite(base):
        return []
    ranges = resolved.ranges()
    tools = case.x["task"]["tools"]
    totals = (math.fsum(t["calls"] * t["price"] for t in tools), math.fsum(t["calls"] * t["latency_s"] for t in tools))
    swings: list[Swing] = []
    for path, v in leaves(case.x):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or path[0] == "latency" or path in _SKIP:
            continue
        if path in ranges:
            lo, hi, basis = ranges[path].low, ranges[path].high, "range"
        elif v:
            lo, hi, basis = v * (1 - POINT_SWING), v * (1 + POINT_SWING), "±20%"
        else:
            continue
        if path in _FRACTIONS:
            lo, hi = max(lo, 1e-9), min(hi, 1.0)
        if path == ("volume", "tasks_per_month"):
            lo = max(lo, 1e-9)
        x, at = case.x, path
        if path[:2] == ("task", "tools"):
            x, at = _one_tool(case.x, path[2], totals), ("task", "tools", 0, *path[3:])
        c_lo, c_hi = (task_cost(with_value(x, at, v), case.op).total for v in (lo, hi))
        swings.append(Swing(_label(case.x, path), ".".join(map(str, path)), lo, hi, c_lo, c_hi, basis))
    if case.x["acceptance"]["pass_rate"] is None and m.graded and m.passes:
        lo, hi = (float(q) for q in beta.ppf([0.05, 0.95], m.passes + 0.5, m.graded - m.passes + 0.5))
        swings.append(_measured("pass rate (measured)", "measured.pass_rate", lo, hi, lambda q: case.with_op(pass_rate=q)))
    service = np.asarray([r.service_s for r in m.requests if r.service_s is not None])
    if service.size >= 2:
        rng = np.random.default_rng(seed)
        means = service[rng.integers(0, service.size, size=(1000, service.size))].mean(axis=1) / service.mean()
        lo, hi = (float(case.op.device_seconds_per_call * r) for r in np.percentile(means, [5, 95]))
        swings.append(_measured("device-seconds per call (measured)", "measured.device_seconds_per_call", lo, hi,
                                case.with_device_seconds))
    swings.sort(key=lambda s: s.swing, reverse=True)
    return swings

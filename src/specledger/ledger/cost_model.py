"""The cost model of the brief, as plain functions.

Every function takes numbers or numpy arrays (the Monte Carlo passes arrays of samples), and
report/assets/calculator.js implements the same formulas for the page; a test keeps them equal.
Inputs arrive as the nested dict of `Resolved.central()` (or with arrays at some leaves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

SECONDS_PER_YEAR = 365.25 * 24 * 3600
J_PER_KWH = 3.6e6
TRAINED_DRAFTERS = ("eagle", "hier")  # strategies whose draft head needs retraining after a target change
Draws = float | np.ndarray  # a point value, or one value per Monte Carlo draw (ledger/montecarlo.py: draw_case)


def expected_attempts(q, retries: int):
    """(1 - (1 - q)^(R+1)) / q, computed stably: -> R+1 as q -> 0, = 1 at q = 1."""
    n = retries + 1
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = -np.expm1(n * np.log1p(-np.minimum(q, 1.0))) / q
    series = n - n * (n - 1) / 2 * q  # first terms of the expansion; exact to ~1e-18 below 1e-9
    out = np.where(q >= 1.0, 1.0, np.where(q < 1e-9, series, exact))
    return out if out.ndim else float(out)


def escalation_probability(q, retries: int):
    """(1 - q)^(R+1): every attempt failed, a person finishes the task."""
    q = np.asarray(q, dtype=np.float64)
    out = np.power(1.0 - np.minimum(q, 1.0), retries + 1)
    return out if out.ndim else float(out)


def per_busy_second(hw: dict) -> bool:
    """Rented and billed only for the seconds it works (serverless): idle time costs nothing."""
    return hw["kind"] == "rented" and hw.get("billing", "always_on") == "per_busy_second"


def device_rate_per_s(hw: dict, provisioned: bool = False):
    """What one device-second costs, before energy. Rent (always on) and capital are paid for every hour, so
    a busy second carries the idle time around it: divided by the utilisation (the share of time busy; the
    same meaning for rented and owned). `provisioned`: the price of one provisioned second instead (when a
    demand rate sets the devices, idle seconds are already among the seconds paid: counted once)."""
    if hw["kind"] == "rented":
        base = hw["price_per_device_hour"] / 3600.0
        if per_busy_second(hw):
            return base
    else:
        base = hw["purchase_price"] / (hw["lifetime_years"] * SECONDS_PER_YEAR)
    if provisioned:
        return base
    u = hw.get("utilisation")
    return base / (1.0 if u is None else u)


def energy_cost(hw: dict, energy_j):
    """Owned hardware pays its energy (times PUE); rent includes it."""
    if hw["kind"] == "rented":
        return 0.0
    return energy_j / J_PER_KWH * hw["energy_price_per_kwh"] * hw["pue"]


def device_hour_cost(hw: dict):
    """One device-hour at full draw: for retraining compute (a rented one is rented for that hour)."""
    cost = device_rate_per_s(hw, provisioned=hw["kind"] == "rented") * 3600.0
    if hw["kind"] == "owned":
        cost = cost + energy_cost(hw, hw["power_watts"] * 3600.0)
    return cost


@dataclass
class OperatingPoint:
    """What the ledger needs from one configuration at one measured load level (the Monte Carlo replaces the
    measured values with arrays of draws)."""

    device_seconds_per_call: Draws
    output_tokens_per_call: Draws
    pass_rate: Draws | None  # measured; None when nothing was graded
    requests_per_s: Draws
    device_count: int = 1
    energy_j_per_call: Draws | None = None  # measured, when the run has it
    energy_spread: float = 0.0  # the energy method's relative 1-sigma error (bench/energy.py METHOD_SPREAD)
    ttft_p95: float | None = None
    tpot_p95: float | None = None
    e2e_p95: float | None = None
    e2e_p50: float | None = None
    p95_from_p99: tuple[str, ...] = ()  # "ttft", "tpot", "e2e": not measured; the p99 stands in as an upper bound
    retrains: bool = False  # a trained draft head: maintenance includes retraining
    # a measured retry loop (ledger/attempts.py): attempts per task in first-attempt device seconds and the share
    # escalated, priced instead of the formula's; None: the formula from the pass rate and the retries
    attempts: float | None = None
    escalation: float | None = None


def replicas_needed(demand_rps, requests_per_s, device_count: int = 1):
    """Devices needed to serve the demand at the measured per-replica throughput."""
    return np.ceil(np.asarray(demand_rps) / np.asarray(requests_per_s) - 1e-9) * device_count


def compute_cost_per_call(hw: dict, op: OperatingPoint, demand_rps=None):
    """Price x device-seconds per call. With a demand rate, every provisioned device-second is paid (unless
    billed per busy second), at the provisioned rate. Energy is drawn only while busy: busy seconds."""
    seconds = op.device_seconds_per_call
    provisioned = demand_rps is not None and not per_busy_second(hw)
    if provisioned:
        seconds = replicas_needed(demand_rps, op.requests_per_s, op.device_count) / demand_rps
    return device_rate_per_s(hw, provisioned) * seconds + energy_per_call(hw, op)


def energy_per_call(hw: dict, op: OperatingPoint):
    """The energy part of a call's compute cost (owned hardware; rent includes it), drawn only while busy."""
    if op.energy_j_per_call is not None and hw.get("use_measured_energy", True):
        energy_j = op.energy_j_per_call
    else:
        watts = hw.get("power_watts")
        energy_j = (0.0 if watts is None else watts) * op.device_seconds_per_call
    return energy_cost(hw, energy_j)


def tool_cost(task: dict):
    return sum(t["calls"] * t["price"] for t in task["tools"])


def task_latency(x: dict, op: OperatingPoint) -> float | None:
    """A task's calls at the median end-to-end latency, plus its tool calls' (None: e2e not measured)."""
    if op.e2e_p50 is None:
        return None
    return x["task"]["calls_per_task"] * op.e2e_p50 + sum(t["calls"] * t["latency_s"] for t in x["task"]["tools"])


def maintenance_per_task(x: dict, retrains: bool):
    """Engineering hours per month plus, for trained draft heads, retraining per change, per task."""
    m = x["maintenance"]
    wage = m["engineer_wage_per_hour"] if m["engineer_wage_per_hour"] is not None else x["acceptance"]["wage_per_hour"]
    monthly = m["engineering_hours_per_month"] * wage
    if m["retraining"] if m["retraining"] is not None else retrains:
        per_change = m["retraining_hours"] * wage + m["retraining_device_hours"] * device_hour_cost(x["hardware"])
        monthly = monthly + per_change * m["changes_per_year"] / 12.0
    return monthly / x["volume"]["tasks_per_month"]


def pass_rate(x: dict, op: OperatingPoint):
    """The cost file's pass rate when it gives one, else the measured one."""
    q = x["acceptance"]["pass_rate"]
    return op.pass_rate if q is None else q


@dataclass
class Breakdown:
    """Cost per accepted task and its parts (numbers, or arrays of Monte Carlo samples)."""

    cost_per_call: float
    attempt_cost: float
    attempts: float
    escalation: float
    compute: float  # attempts x calls x compute per call
    tools: float  # attempts x retrieval/tool calls
    labour: float  # review + escalation x fix
    maintenance: float
    total: float
    per_million_tokens: float
    task_latency_s: float | None
    pass_rate: float
    infinite: bool = False  # pass rate 0: no attempt is ever accepted
    energy: float = 0.0  # the energy part of `compute` (owned hardware only: rent includes it)


def task_cost(x: dict, op: OperatingPoint) -> Breakdown:
    """Cost per accepted task: attempts x attempt cost + review + escalation x fix + maintenance."""
    acc, task, hw = x["acceptance"], x["task"], x["hardware"]
    q = pass_rate(x, op)
    per_call = compute_cost_per_call(hw, op, x["volume"]["demand_rps"])
    attempt = task["calls_per_task"] * per_call + tool_cost(task)
    retries = int(acc["retries"])
    attempts = expected_attempts(q, retries) if op.attempts is None else op.attempts
    esc = escalation_probability(q, retries) if op.escalation is None else op.escalation
    wage_per_min = acc["wage_per_hour"] / 60.0
    compute = attempts * task["calls_per_task"] * per_call
    tools = attempts * tool_cost(task)
    labour = acc["review_minutes"] * wage_per_min + esc * acc["fix_minutes"] * wage_per_min
    maint = maintenance_per_task(x, op.retrains)
    total = compute + tools + labour + maint
    zero = np.asarray(q) == 0
    infinite = bool(np.all(zero))
    if zero.ndim:
        total = np.where(zero, np.inf, total)
    elif infinite:
        total = math.inf
    per_m = per_call / op.output_tokens_per_call * 1e6 if np.all(np.asarray(op.output_tokens_per_call) > 0) else math.nan
    energy = attempts * task["calls_per_task"] * energy_per_call(hw, op)
    return Breakdown(per_call, attempt, attempts, esc, compute, tools, labour, maint, total, per_m, task_latency(x, op),
                     q, infinite, energy)


def objective_misses(x: dict, op: OperatingPoint) -> list[str]:
    """Latency objectives this operating point misses (empty: feasible)."""
    lat, misses = x["latency"], []
    for key, value, label in (("ttft_p95_s", op.ttft_p95, "p95 TTFT"), ("tpot_p95_s", op.tpot_p95, "p95 TPOT"),
                              ("e2e_p95_s", op.e2e_p95, "p95 e2e")):
        limit = lat[key]
        if limit is not None and (value is None or value > limit):
            have = "not measured" if value is None else f"{_g3(value)} s"
            if value is not None and label.split()[1].lower() in op.p95_from_p99:
                have = f"<= p99 {have} (p95 not measured)"
            misses.append(f"{label} {have} > {_g3(limit)} s")
    t = task_latency(x, op)
    if lat["task_s"] is not None and t is not None and t > lat["task_s"]:
        misses.append(f"task latency {_g3(t)} s > {_g3(lat['task_s'])} s")
    return misses


def _g3(v: float) -> str:
    """Three significant digits, written as calculator.js writes them."""
    return f"{float(f'{v:.3g}'):g}"


def with_value(x, path: tuple, value):
    """The nested inputs with one leaf replaced, sharing every untouched branch (nothing here mutates inputs: a
    search prices thousands of such copies)."""
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(x, list):
        return [with_value(v, rest, value) if i == k else v for i, v in enumerate(x)]
    return {**x, k: with_value(x[k], rest, value)}


def get_value(x: dict, path: tuple):
    for k in path:
        x = x[k]
    return x


@dataclass
class Case:
    """One configuration at its priced load level: inputs (central values) and measurements."""

    name: str
    x: dict
    op: OperatingPoint
    sweep: list[tuple[float, float]] = field(default_factory=list)  # (concurrency, requests/s) measured
    concurrency: float | None = None  # of the priced level

    def cost(self) -> Breakdown:
        return task_cost(self.x, self.op)

    def with_op(self, **changes) -> Case:
        return replace(self, op=replace(self.op, **changes))

    def with_device_seconds(self, v: float) -> Case:
        """Another device time per call, the throughput scaled with it."""
        scale = v / self.op.device_seconds_per_call
        return self.with_op(device_seconds_per_call=v, requests_per_s=self.op.requests_per_s / scale)

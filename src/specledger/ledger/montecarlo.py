"""Uncertainty: sample the input ranges and the measurements, price every sample.

Inputs shared by configurations use the same random draw in every configuration (common random
numbers), so "which is cheapest" compares like with like. Measurements are bootstrapped per
request (device time, tokens, latency percentiles); the pass rate is drawn from its Beta
posterior (Jeffreys prior) unless the cost file fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import triang

from specledger.ledger.inputs import Range, Resolved
from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.model import Case, task_cost, tool_latency, with_value


@dataclass
class Interval:
    mean: float
    p5: float
    p95: float
    p_feasible: float
    p_cheapest: float = 0.0


def triangular(u: np.ndarray, r: Range) -> np.ndarray:
    """Inverse CDF of the triangular distribution at uniforms u."""
    if r.high == r.low:
        return np.full_like(u, r.low)
    c = (r.centre - r.low) / (r.high - r.low)
    return triang.ppf(u, c, loc=r.low, scale=r.high - r.low)


def _bootstrap(values: list[float], idx_rng: np.random.Generator, n: int) -> np.ndarray | None:
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size < 2:
        return None
    return x[idx_rng.integers(0, x.size, size=(n, x.size))]


def sample_case(case: Case, resolved: Resolved, m: ConfigMeasurement, uniforms: dict[tuple, np.ndarray],
                n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Cost samples and feasibility samples of one configuration."""
    x = case.x
    for path, r in resolved.ranges().items():
        x = with_value(x, path, triangular(uniforms[path], r))
    op = case.op
    service = [r.service_s for r in m.requests]
    if sum(s is not None for s in service) >= 2:
        rows = rng.integers(0, len(m.requests), size=(n, len(m.requests)))
        svc = np.asarray([s if s is not None else np.nan for s in service])
        toks = np.asarray([r.output_tokens for r in m.requests], dtype=np.float64)
        ratio = np.nanmean(svc[rows], axis=1) / np.nanmean(svc)
        op = replace(
            op,
            device_seconds_per_call=op.device_seconds_per_call * ratio,
            requests_per_s=op.requests_per_s / ratio,
            output_tokens_per_call=np.maximum(toks[rows].mean(axis=1), 1e-9),
            energy_j_per_call=None if op.energy_j_per_call is None else op.energy_j_per_call * ratio,
        )
    if x["acceptance"]["pass_rate"] is None and m.graded and m.passes:
        op = replace(op, pass_rate=rng.beta(m.passes + 0.5, m.graded - m.passes + 0.5, size=n))
    costs = np.broadcast_to(np.asarray(task_cost(x, op).total, dtype=np.float64), (n,))

    feasible = np.ones(n, dtype=bool)
    lat = x["latency"]
    for key, attr in (("ttft_p95_s", "ttft_s"), ("tpot_p95_s", "tpot_s"), ("e2e_p95_s", "e2e_s")):
        limit = lat[key]
        if limit is None:
            continue
        boot = _bootstrap([getattr(r, attr) for r in m.requests], rng, n)
        point = getattr(op, attr.replace("_s", "_p95"))
        p95 = np.percentile(boot, 95, axis=1) if boot is not None else np.full(n, np.inf if point is None else point)
        feasible &= p95 <= limit
    if lat["task_s"] is not None and op.e2e_p50 is not None:
        feasible &= np.asarray(x["task"]["calls_per_task"] * op.e2e_p50 + tool_latency(x["task"])) <= lat["task_s"]
    return costs.copy(), feasible


def simulate(
    cases: list[tuple[Case, Resolved, ConfigMeasurement]],
    *,
    eligible: set[str],
    samples: int = 2000,
    seed: int = 0,
) -> dict[str, Interval]:
    """Mean and 90% interval of cost per accepted task per configuration, and P(cheapest) among `eligible`."""
    rng = np.random.default_rng(seed)
    paths = sorted({p for _, res, _ in cases for p in res.ranges()}, key=lambda p: tuple(map(str, p)))
    uniforms = {p: rng.random(samples) for p in paths}
    out: dict[str, Interval] = {}
    costs: dict[str, np.ndarray] = {}
    for i, (case, res, m) in enumerate(cases):
        c, f = sample_case(case, res, m, uniforms, samples, np.random.default_rng([seed, i + 1]))
        costs[case.name] = c
        finite = c[np.isfinite(c)]
        mean = float(c.mean()) if finite.size == c.size else float("inf")
        p5, p95 = (float(np.percentile(c, 5)), float(np.percentile(c, 95))) if finite.size else (np.inf, np.inf)
        out[case.name] = Interval(mean=mean, p5=p5, p95=p95, p_feasible=float(f.mean()))
    names = [n for n in costs if n in eligible]
    if names:
        stack = np.vstack([costs[n] for n in names])
        winners = np.bincount(np.argmin(stack, axis=0), minlength=len(names))
        for n, w in zip(names, winners):
            out[n].p_cheapest = float(w / samples)
    return out

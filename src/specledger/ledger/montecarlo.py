"""Uncertainty: sample the input ranges and the measurements, price every sample.

Inputs shared by configurations use the same random draw in every configuration (common random
numbers), so "which is cheapest" compares like with like. So do the measurements: every sample
resamples the prompts once, and each configuration's device time is taken over that same draw of
prompts (paired: a hard prompt is hard for all), and the pass rate is a Bayesian bootstrap over the
graded items with one set of item weights shared by every configuration, so configurations with the
same pass/fail on every item (identical outputs) get identical pass-rate draws, and close ones
closely correlated draws. Measurements without prompt keys or per-item grades (priced from
elsewhere) fall back to an independent bootstrap and a Beta posterior (Jeffreys prior).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import warnings

import numpy as np
from scipy.stats import triang

from specledger.ledger.inputs import Range, Resolved
from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.cost_model import Case, OperatingPoint, task_cost, task_latency, with_value


@dataclass
class Interval:
    mean: float
    p5: float
    p95: float
    p_feasible: float
    p_cheapest: float = 0.0
    costs: np.ndarray | None = field(default=None, repr=False)  # the samples, paired across configurations


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


@dataclass
class SharedDraws:
    """Draws every configuration uses: prompt resamples and item weights (common random numbers)."""

    prompts: list[str]
    prompt_rows: np.ndarray | None  # (n, len(prompts)) indices into prompts
    items: list[str]
    item_weights: np.ndarray | None  # (n, len(items)) Bayesian-bootstrap weights, rows sum to 1


def shared_draws(ms: list[ConfigMeasurement], n: int, rng: np.random.Generator) -> SharedDraws:
    prompts = sorted({r.key for m in ms for r in m.requests if r.key})
    items = sorted({k for m in ms for k in m.grades})
    rows = rng.integers(0, len(prompts), size=(n, len(prompts))) if len(prompts) >= 2 else None
    weights = rng.dirichlet(np.ones(len(items)), size=n) if items else None
    return SharedDraws(prompts, rows, items, weights)


def _paired_service(m: ConfigMeasurement, shared: SharedDraws) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean service time and output tokens of m over each sample's shared draw of prompts."""
    if shared.prompt_rows is None or not all(r.key for r in m.requests):
        return None
    pos = {k: i for i, k in enumerate(shared.prompts)}
    svc = np.full(len(shared.prompts), np.nan)
    toks = np.full(len(shared.prompts), np.nan)
    for r in m.requests:
        if r.service_s is not None:
            svc[pos[r.key]], toks[pos[r.key]] = r.service_s, r.output_tokens
    picked, picked_t = svc[shared.prompt_rows], toks[shared.prompt_rows]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a draw of only prompts m lacks: its own mean instead
        mean_s, mean_t = np.nanmean(picked, axis=1), np.nanmean(picked_t, axis=1)
    mean_s = np.where(np.isfinite(mean_s), mean_s, np.nanmean(svc))
    mean_t = np.where(np.isfinite(mean_t), mean_t, np.nanmean(toks))
    return mean_s / np.nanmean(svc), mean_t


def _paired_pass_rate(m: ConfigMeasurement, shared: SharedDraws) -> np.ndarray | None:
    """Bayesian bootstrap of m's pass rate with the shared item weights, shrunk like the Jeffreys posterior
    mean ((passes + 1/2) / (graded + 1)) so that 0 of n or n of n still leave room either side."""
    if shared.item_weights is None or not m.grades:
        return None
    pos = {k: i for i, k in enumerate(shared.items)}
    idx = np.array([pos[k] for k in m.grades])
    passed = np.array([float(v) for v in m.grades.values()])
    w = shared.item_weights[:, idx]
    rate = (w * passed).sum(axis=1) / w.sum(axis=1)
    g = len(idx)
    # failed requests are failed attempts (measurements.py counts them in `graded`): they scale the rate down
    failed = m.requests_failed if m.graded else 0
    rate = rate * g / (g + failed)
    g += failed
    return (g * rate + 0.5) / (g + 1)


def sample_case(case: Case, resolved: Resolved, m: ConfigMeasurement, uniforms: dict[tuple, np.ndarray],
                n: int, rng: np.random.Generator, shared: SharedDraws | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Cost samples and feasibility samples of one configuration."""
    x, op = draw_case(case, resolved, m, uniforms, n, rng, shared)
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
    t = task_latency(x, op)
    if lat["task_s"] is not None and t is not None:
        feasible &= np.asarray(t) <= lat["task_s"]
    return costs.copy(), feasible


ENERGY_SEED = 20260  # the energy method's error draws: fixed, so every configuration of a run shares them


def draw_case(case: Case, resolved: Resolved, m: ConfigMeasurement, uniforms: dict[tuple, np.ndarray],
              n: int, rng: np.random.Generator, shared: SharedDraws | None = None) -> tuple[dict, OperatingPoint]:
    """One configuration's inputs and operating point with n draws at their leaves: task_cost(x, op) prices them
    (ledger/thresholds.py re-prices the same draws with one input changed)."""
    x = case.x
    for path, r in resolved.ranges().items():
        x = with_value(x, path, triangular(uniforms[path], r))
    op = case.op
    service = [r.service_s for r in m.requests]
    paired = _paired_service(m, shared) if shared is not None else None
    if paired is None and sum(s is not None for s in service) >= 2:  # its own resample of its requests
        rows = rng.integers(0, len(m.requests), size=(n, len(m.requests)))
        svc = np.asarray([s if s is not None else np.nan for s in service])
        toks = np.asarray([r.output_tokens for r in m.requests], dtype=np.float64)
        paired = np.nanmean(svc[rows], axis=1) / np.nanmean(svc), toks[rows].mean(axis=1)
    if paired is not None:
        ratio, tokens = paired
        op = replace(op, device_seconds_per_call=op.device_seconds_per_call * ratio,
                     requests_per_s=op.requests_per_s / ratio, output_tokens_per_call=np.maximum(tokens, 1e-9),
                     energy_j_per_call=None if op.energy_j_per_call is None else op.energy_j_per_call * ratio)
    if op.energy_j_per_call is not None and op.energy_spread > 0:
        # the energy method's own error (a counter's ~12%, an estimate's ~50%): one log-normal factor per draw,
        # the same draws for every configuration (one method, one bias), so it widens each cost, not the gaps
        z = np.random.default_rng(ENERGY_SEED).standard_normal(n)
        factor = np.exp(op.energy_spread * z - op.energy_spread ** 2 / 2)
        op = replace(op, energy_j_per_call=op.energy_j_per_call * factor)
    if x["acceptance"]["pass_rate"] is None and m.graded and m.passes:
        q = _paired_pass_rate(m, shared) if shared is not None else None
        op = replace(op, pass_rate=q if q is not None else rng.beta(m.passes + 0.5, m.graded - m.passes + 0.5, size=n))
    return x, op


def draws(cases: list[tuple[Case, Resolved, ConfigMeasurement]], samples: int,
          seed: int) -> tuple[dict[tuple, np.ndarray], SharedDraws]:
    """The common random numbers of one seed: a uniform per ranged input, and the shared prompt and item draws."""
    rng = np.random.default_rng(seed)
    paths = sorted({p for _, res, _ in cases for p in res.ranges()}, key=lambda p: tuple(map(str, p)))
    uniforms = {p: rng.random(samples) for p in paths}
    return uniforms, shared_draws([m for _, _, m in cases], samples, rng)


def draw_all(cases: list[tuple[Case, Resolved, ConfigMeasurement]], samples: int,
             seed: int) -> list[tuple[dict, OperatingPoint]]:
    """Every case's drawn inputs and operating point, exactly as `simulate` prices them."""
    uniforms, shared = draws(cases, samples, seed)
    return [draw_case(case, res, m, uniforms, samples, np.random.default_rng([seed, i + 1]), shared)
            for i, (case, res, m) in enumerate(cases)]


def simulate(cases: list[tuple[Case, Resolved, ConfigMeasurement]], *, eligible: set[str], samples: int = 2000,
             seed: int = 0) -> dict[str, Interval]:
    """Mean and 90% interval of cost per accepted task per configuration, and P(cheapest) among `eligible`."""
    uniforms, shared = draws(cases, samples, seed)
    out: dict[str, Interval] = {}
    costs: dict[str, np.ndarray] = {}
    for i, (case, res, m) in enumerate(cases):  # the i-th case's own stream: [seed, i+1]
        c, f = sample_case(case, res, m, uniforms, samples, np.random.default_rng([seed, i + 1]), shared)
        costs[case.name] = c
        finite = c[np.isfinite(c)]
        mean = float(c.mean()) if finite.size == c.size else float("inf")
        p5, p95 = (float(np.percentile(c, 5)), float(np.percentile(c, 95))) if finite.size else (np.inf, np.inf)
        out[case.name] = Interval(mean=mean, p5=p5, p95=p95, p_feasible=float(f.mean()), costs=c)
    names = [n for n in costs if n in eligible]
    if names:
        stack = np.vstack([costs[n] for n in names])
        # a tie (identical samples, e.g. identical configurations) splits the win instead of going to the first
        best = stack == stack.min(axis=0)
        share = (best / best.sum(axis=0)).mean(axis=1)
        for n, w in zip(names, share):
            out[n].p_cheapest = float(w)
    return out

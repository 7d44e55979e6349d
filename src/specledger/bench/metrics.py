"""Per-request latencies and their aggregates (percentiles with bootstrap confidence intervals).

ITL follows the brief: when one step or one streamed chunk delivers several tokens, its gap is
spread evenly over them, so speculation does not show up as one long gap and several zeros.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from specledger.records.config import SLO
from specledger.records.results import Aggregate, Dist, RequestRecord
from specledger.spec_stats import merge_levels

STATS = ("mean", "p50", "p90", "p95", "p99")
_QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}


def spread_itl(chunks: Sequence[tuple[float, int]]) -> list[float]:
    """Inter-token latencies from (arrival time, tokens in chunk) pairs, in order.

    Tokens that arrive with the first one get a zero gap; a later chunk of n tokens arriving g
    seconds after the previous one contributes n gaps of g / n. Returns output tokens - 1 values.
    """
    out: list[float] = []
    prev: float | None = None
    for t, n in chunks:
        if n <= 0:
            continue
        if prev is None:
            out.extend([0.0] * (n - 1))
        else:
            gap = max(0.0, t - prev) / n
            out.extend([gap] * n)
        prev = t
    return out


def chunks_from_token_times(token_times: Sequence[float]) -> list[tuple[float, int]]:
    """Group per-token timestamps into chunks (tokens of one step share a timestamp)."""
    chunks: list[tuple[float, int]] = []
    for t in token_times:
        if chunks and chunks[-1][0] == t:
            chunks[-1] = (t, chunks[-1][1] + 1)
        else:
            chunks.append((t, 1))
    return chunks


def tpot(e2e_s: float | None, ttft_s: float | None, output_tokens: int) -> float | None:
    if e2e_s is None or ttft_s is None or output_tokens < 2:
        return None
    return (e2e_s - ttft_s) / (output_tokens - 1)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if len(values) == 0:
        return {s: None for s in STATS}
    x = np.asarray(values, dtype=np.float64)
    return {"mean": float(x.mean()), **{name: float(np.percentile(x, 100 * q)) for name, q in _QUANTILES.items()}}


def bootstrap_ci(
    values: Sequence[float],
    groups: Sequence[int] | None = None,
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile-bootstrap CIs of the mean and p50/p90/p95/p99.

    With `groups` (one id per value, e.g. the request an ITL belongs to) whole groups are
    resampled, since tokens of one request are not independent. Vectorised: each resample is a
    multinomial weight per group over the once-sorted values.
    """
    x = np.asarray(values, dtype=np.float64)
    if resamples <= 0 or x.size < 2:
        return {}
    g = np.arange(x.size) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    n_groups = int(g.max()) + 1
    if n_groups < 2:
        return {}
    order = np.argsort(x, kind="stable")
    xs, gs = x[order], g[order]
    rng = np.random.default_rng(seed)
    stats: dict[str, list[np.ndarray]] = {s: [] for s in STATS}
    batch = max(1, min(resamples, 4_000_000 // max(1, xs.size)))
    done = 0
    while done < resamples:
        b = min(batch, resamples - done)
        done += b
        counts = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=b)  # (b, groups)
        w = counts[:, gs].astype(np.float64)  # (b, values) weight of each sorted value
        total = w.sum(axis=1)
        ok = total > 0
        w, total = w[ok], total[ok]
        stats["mean"].append((w * xs).sum(axis=1) / total)
        cum = np.cumsum(w, axis=1)  # integer-valued
        stride = xs.size * (n_groups + 1) + 1.0
        rows = np.arange(w.shape[0])
        offsets = rows * stride
        flat = (cum + offsets[:, None]).ravel()
        for name, q in _QUANTILES.items():
            h = q * (total - 1)  # position in the resampled sorted sequence (numpy "linear")
            k0 = np.floor(h)
            k1 = np.minimum(k0 + 1, total - 1)
            j0, j1 = (np.clip(np.searchsorted(flat, k + offsets, side="right") - rows * xs.size, 0, xs.size - 1)
                      for k in (k0, k1))
            stats[name].append(xs[j0] + (h - k0) * (xs[j1] - xs[j0]))
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    out = {}
    for name, parts in stats.items():
        arr = np.concatenate(parts)
        if arr.size:
            out[name] = (float(np.percentile(arr, lo)), float(np.percentile(arr, hi)))
    return out


def dist(values: Sequence[float], groups: Sequence[int] | None = None, *, resamples: int = 1000,
         seed: int = 0) -> Dist:
    p = percentiles(values)
    return Dist(n=len(values), ci=bootstrap_ci(values, groups, resamples=resamples, seed=seed), **p)


def busy_time(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: time with at least one request in service."""
    ordered = iter(sorted(intervals))
    first = next(ordered, None)
    if first is None:
        return 0.0
    total = 0.0
    cur_s, cur_e = first
    for s, e in ordered:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    total += cur_e - cur_s
    return total


def meets_slo(r: RequestRecord, slo: SLO | None) -> bool:
    if r.status != "ok":
        return False
    if slo is None:
        return True
    if slo.ttft_s is not None and (r.ttft_s is None or r.ttft_s > slo.ttft_s):
        return False
    if slo.tpot_s is not None and r.tpot_s is not None and r.tpot_s > slo.tpot_s:
        return False
    if slo.e2e_s is not None and (r.e2e_s is None or r.e2e_s > slo.e2e_s):
        return False
    return True


def aggregate(
    records: Sequence[RequestRecord],
    *,
    wall_s: float | None = None,
    energy_j: float | None = None,
    slo: SLO | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> Aggregate:
    """Aggregate one set of requests. wall_s defaults to the time any of them was in service."""
    ok = [r for r in records if r.status == "ok"]
    failed = [r for r in records if r.status != "ok"]
    if wall_s is None:
        wall_s = busy_time((r.start_t or r.arrival_t, r.end_t) for r in records)

    def d(vals: list[float], groups: list[int] | None = None) -> Dist:
        return dist(vals, groups, resamples=resamples, seed=seed)

    itl_vals = [x for r in ok for x in r.itl_s]
    itl_groups = [i for i, r in enumerate(ok) for _ in r.itl_s]  # the request each gap belongs to

    out_tokens = sum(r.output_tokens for r in ok)
    a = Aggregate(
        requests_ok=len(ok),
        requests_failed=len(failed),
        errors=dict(Counter(r.error_kind or "other" for r in failed)),
        retries=sum(r.attempts - 1 for r in records),
        transport_retries=sum(r.transport_retries for r in records),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        output_tokens=out_tokens,
        ttft=d([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot=d([r.tpot_s for r in ok if r.tpot_s is not None]),
        itl=d(itl_vals, itl_groups),
        e2e=d([r.e2e_s for r in ok if r.e2e_s is not None]),
        queue=d([r.queue_s for r in ok]),
        request_tok_s=d([r.output_tokens / r.e2e_s for r in ok if r.e2e_s]),
        wall_s=wall_s,
        usage_disagreements=sum(r.usage_disagrees for r in records),
    )
    if wall_s > 0:
        a.output_tok_s = out_tokens / wall_s
        a.requests_s = len(ok) / wall_s
        if slo is not None:
            a.slo_met = sum(meets_slo(r, slo) for r in records)
            a.goodput_rps = a.slo_met / wall_s
    stepped = [(r, r.steps) for r in ok if r.steps]
    if stepped:
        steps = a.steps = sum(n for _, n in stepped)
        a.tau = sum((r.tau if r.tau is not None else r.output_tokens / n) * n for r, n in stepped) / steps
    a.acceptance = merge_levels(r.levels for r in ok)
    for phase in ("draft_s", "verify_s"):  # summed where any request reports the phase
        if any(getattr(r, phase) is not None for r in ok):
            setattr(a, phase, sum(getattr(r, phase) or 0.0 for r in ok))
    energies = [r.energy_j for r in ok if r.energy_j is not None]
    if energy_j is None and ok and len(energies) == len(ok):
        energy_j = sum(energies)
    if energy_j is not None:
        a.energy_j = energy_j
        a.energy_j_per_token = energy_j / out_tokens if out_tokens else None
    a.peak_rss_bytes = max((r.peak_rss_bytes for r in records if r.peak_rss_bytes is not None), default=None)
    a.cuda_max_allocated_bytes = max((r.cuda_max_allocated_bytes for r in records
                                      if r.cuda_max_allocated_bytes is not None), default=None)
    graded = [r.grade for r in records if r.grade is not None and r.grade.passed is not None]
    a.graded = len(graded)
    a.passed = sum(bool(g.passed) for g in graded)
    return a

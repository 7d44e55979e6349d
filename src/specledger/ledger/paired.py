"""Paired statistics: two configurations compared on the same prompts and the same graded items.

Machine drift and prompt difficulty hit both members of a pair alike, so differences are taken per
prompt and the prompts (not the requests of each configuration separately) are resampled:
- speed-up: throughput ratio over the prompts both completed, with a seeded bootstrap interval;
- quality: an exact McNemar test on the items where exactly one of the two passed;
- cost: a difference interval from Monte Carlo samples drawn with common random numbers
  (ledger/montecarlo.py), read by `difference`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest

LEVEL = 0.95  # two-sided intervals


@dataclass
class PairedRatio:
    """Throughput of A over B on the prompts both completed."""

    n: int
    ratio: float | None
    low: float | None
    high: float | None


def paired_speedup(a: dict[str, tuple[float, int]], b: dict[str, tuple[float, int]], *, resamples: int = 2000,
                   seed: int = 0) -> PairedRatio:
    """`a`, `b`: prompt key -> (service seconds, output tokens). Ratio of A's tokens/s to B's over the common
    prompts; the interval resamples prompts, each drawn prompt carrying both its A and its B measurement."""
    keys = sorted(k for k in a.keys() & b.keys() if a[k][0] > 0 and b[k][0] > 0)
    if not keys:
        return PairedRatio(0, None, None, None)
    sa = np.array([a[k][0] for k in keys])
    ta = np.array([a[k][1] for k in keys], dtype=np.float64)
    sb = np.array([b[k][0] for k in keys])
    tb = np.array([b[k][1] for k in keys], dtype=np.float64)

    def ratio(idx):
        return (ta[idx].sum(-1) / sa[idx].sum(-1)) / np.maximum(tb[idx].sum(-1) / sb[idx].sum(-1), 1e-300)

    point = float(ratio(np.arange(len(keys))))
    if len(keys) < 2 or resamples <= 0:
        return PairedRatio(len(keys), point, None, None)
    rng = np.random.default_rng(seed)
    draws = ratio(rng.integers(0, len(keys), size=(resamples, len(keys))))
    tail = 100 * (1 - LEVEL) / 2
    return PairedRatio(len(keys), point, float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail)))


@dataclass
class QualityTest:
    """Exact McNemar test of A's and B's pass/fail on the same items."""

    config_a: str
    config_b: str
    items: int  # graded under both
    a_only: int  # passed under A, failed under B (with repeats: A passed the larger share of its answers)
    b_only: int
    p_value: float
    note: str


def mcnemar(name_a: str, a: dict[str, float], name_b: str, b: dict[str, float]) -> QualityTest:
    """Only discordant items carry information; under "same quality" each is A's win with probability 1/2.
    An item is graded 1 (passed) or 0, or with repeats by the share of its answers that passed; it is A's
    when A's share is larger: the sign test, which is McNemar's exact test for pass/fail items."""
    keys = a.keys() & b.keys()
    a_only = sum(1 for k in keys if a[k] > b[k])
    b_only = sum(1 for k in keys if b[k] > a[k])
    n = a_only + b_only
    if not keys:
        return QualityTest(name_a, name_b, 0, 0, 0, 1.0, "no item graded under both")
    if n == 0:
        return QualityTest(name_a, name_b, len(keys), 0, 0, 1.0, f"same pass/fail on all {len(keys)} items")
    p = float(binomtest(a_only, n, 0.5).pvalue)
    if p < 1 - LEVEL:
        better = name_a if a_only > b_only else name_b
        note = f"{better} passes more ({a_only} vs {b_only} discordant items, exact McNemar p={p:.2g})"
    else:
        note = f"no evidence of a difference ({a_only} vs {b_only} discordant items, p={p:.2g})"
    return QualityTest(name_a, name_b, len(keys), a_only, b_only, p, note)


@dataclass
class Difference:
    """cost(A) - cost(B) per accepted task over paired Monte Carlo samples."""

    mean: float
    low: float
    high: float


def difference(a: np.ndarray, b: np.ndarray) -> Difference | None:
    """Interval of the paired difference; None when there are no finite paired samples."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return None
    tail = 100 * (1 - LEVEL) / 2
    return Difference(float(d.mean()), float(np.percentile(d, tail)), float(np.percentile(d, 100 - tail)))

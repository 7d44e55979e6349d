"""Latency arithmetic: ITL spreading, TPOT, percentiles, bootstrap CIs, aggregates, goodput."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.records.config import SLO
from specledger.bench.metrics import (
    aggregate, bootstrap_ci, busy_time, chunks_from_token_times, percentiles, spread_itl, tpot,
)
from specledger.records.results import RequestGrade, RequestRecord
from specledger.spec_stats import LevelStats


def test_spread_itl_spreads_multi_token_chunks():
    # 1 token at t=1.0, then a 3-token chunk 0.3 s later, then 1 token 0.1 s later
    assert spread_itl([(1.0, 1), (1.3, 3), (1.4, 1)]) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    # a first chunk of 2 tokens: the second arrives with the first
    assert spread_itl([(0.5, 2), (0.7, 2)]) == pytest.approx([0.0, 0.1, 0.1])
    assert spread_itl([]) == []
    assert spread_itl([(1.0, 1)]) == []


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(1, 8)), min_size=1, max_size=20))
@settings(max_examples=60, deadline=None)
def test_spread_itl_counts_and_sums(chunks):
    times = np.cumsum([g for g, _ in chunks])
    seq = [(float(t), n) for t, (_, n) in zip(times, chunks)]
    itl = spread_itl(seq)
    assert len(itl) == sum(n for _, n in seq) - 1
    assert sum(itl) == pytest.approx(seq[-1][0] - seq[0][0], abs=1e-9)


def test_chunks_from_token_times_groups_shared_timestamps():
    assert chunks_from_token_times([1.0, 2.0, 2.0, 2.0, 3.0]) == [(1.0, 1), (2.0, 3), (3.0, 1)]


def test_tpot():
    assert tpot(1.0, 0.2, 5) == pytest.approx(0.2)
    assert tpot(1.0, 0.2, 1) is None


def test_percentiles_hand_computed():
    """Linear interpolation between order statistics: rank q(n - 1), counted from 0."""
    x = list(range(100, 0, -1))  # 1..100, unsorted
    p = percentiles(x)
    assert p["mean"] == pytest.approx(50.5)
    assert p["p50"] == pytest.approx(50.5)  # rank 49.5: between 50 and 51
    assert p["p90"] == pytest.approx(90.1)  # rank 89.1
    assert p["p99"] == pytest.approx(99.01)  # rank 98.01
    assert percentiles([30.0, 0.0, 20.0, 10.0]) == pytest.approx(
        {"mean": 15.0, "p50": 15.0, "p90": 27.0, "p95": 28.5, "p99": 29.7})
    assert percentiles([7.0])["p99"] == 7.0
    assert percentiles([])["p90"] is None


def _naive_bootstrap(x, groups, stat, resamples, rng):
    ids = np.unique(groups)
    out = []
    for _ in range(resamples):
        pick = rng.choice(ids, size=ids.size, replace=True)
        sample = np.concatenate([x[groups == g] for g in pick])
        out.append(stat(sample))
    return np.percentile(out, [2.5, 97.5])


@pytest.mark.parametrize("clustered", [False, True])
def test_bootstrap_ci_agrees_with_a_naive_bootstrap(clustered):
    rng = np.random.default_rng(1)
    n = 240  # dense enough that tail percentiles do not jump between far-apart order statistics
    groups = np.repeat(np.arange(n // 3), 3) if clustered else np.arange(n)
    x = rng.normal(size=n) + (0.5 * (groups % 5) if clustered else 0)
    ci = bootstrap_ci(x, groups if clustered else None, resamples=2000, seed=3)
    for name, stat in (("mean", np.mean), ("p50", np.median), ("p90", lambda v: np.percentile(v, 90))):
        lo, hi = _naive_bootstrap(x, groups, stat, 1000, np.random.default_rng(4))
        width = hi - lo
        assert ci[name][0] == pytest.approx(lo, abs=0.2 * width)
        assert ci[name][1] == pytest.approx(hi, abs=0.2 * width)
        point = stat(x)
        assert ci[name][0] <= point <= ci[name][1]


def test_bootstrap_degenerate_inputs():
    assert bootstrap_ci([1.0]) == {}
    assert bootstrap_ci([1.0, 2.0, 3.0], [0, 0, 0]) == {}
    assert bootstrap_ci([1.0, 2.0], resamples=0) == {}
    ci = bootstrap_ci([2.0] * 10, resamples=100)
    assert ci["p99"] == (2.0, 2.0)


def test_busy_time_is_the_union():
    assert busy_time([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert busy_time([]) == 0.0


def rec(i: int, *, ttft=0.1, e2e=1.0, tokens=10, status="ok", steps=None, tau=None, category="qa",
        levels=(), passed=None) -> RequestRecord:
    return RequestRecord(
        run_id="r", config="c", request_id=f"c|c=1|{i}|t1", item=i, question_id=str(i), category=category,
        kind="qa", turn=1, turns=1, load="c=1", concurrency=1, status=status, arrival_t=100.0 + i,
        start_t=100.0 + i, end_t=100.0 + i + e2e, ttft_s=ttft if status == "ok" else None,
        e2e_s=e2e if status == "ok" else None, tpot_s=tpot(e2e, ttft, tokens), itl_s=[(e2e - ttft) / (tokens - 1)] *
        (tokens - 1), output_tokens=tokens if status == "ok" else 0, steps=steps, tau=tau,
        levels=[LevelStats(name=n, proposed=p, accepted=a) for n, p, a in levels],
        grade=RequestGrade(passed=passed, grader="t") if passed is not None else None,
    )


def test_aggregate_counts_rates_tau_goodput():
    records = [
        rec(0, ttft=0.1, steps=4, tau=2.5, levels=[("draft", 12, 6)], passed=True),
        rec(1, ttft=0.3, steps=5, tau=2.0, levels=[("draft", 15, 5)], passed=False),
        rec(2, ttft=0.2, e2e=3.0, steps=5, tau=2.0, levels=[("draft", 10, 5)]),
        rec(3, status="failed"),
    ]
    a = aggregate(records, wall_s=4.0, slo=SLO(ttft_s=0.25, e2e_s=2.0), resamples=100)
    assert (a.requests_ok, a.requests_failed) == (3, 1)
    assert a.output_tokens == 30
    assert a.output_tok_s == pytest.approx(30 / 4.0)
    assert a.requests_s == pytest.approx(3 / 4.0)
    assert a.slo_met == 1 and a.goodput_rps == pytest.approx(1 / 4.0)  # only request 0 meets both
    assert a.steps == 14 and a.tau == pytest.approx((2.5 * 4 + 2.0 * 5 + 2.0 * 5) / 14)
    (acc,) = a.acceptance
    assert (acc.proposed, acc.accepted) == (37, 16) and acc.rate == pytest.approx(16 / 37)
    assert a.ttft.p50 == pytest.approx(0.2) and a.ttft.n == 3
    assert a.itl.n == 27
    assert (a.graded, a.passed) == (2, 1)
    assert a.energy_j is None


def test_aggregate_wall_defaults_to_busy_time_and_energy_sums():
    records = [rec(0), rec(1)]
    for r in records:
        r.energy_j = 2.0
    a = aggregate(records, resamples=0)
    assert a.wall_s == pytest.approx(2.0)  # [100,101] and [101,102]
    assert a.energy_j == pytest.approx(4.0) and a.energy_j_per_token == pytest.approx(0.2)
    assert a.ttft.ci == {}


def test_aggregate_sums_phases_and_keeps_memory_peaks():
    """Draft and verification seconds sum over the requests that report them (None when none does); memory is the
    peak over requests."""
    records = [rec(0), rec(1), rec(2)]
    records[0].draft_s, records[1].draft_s, records[1].verify_s = 0.5, 0.25, 1.5
    records[0].peak_rss_bytes, records[2].peak_rss_bytes, records[1].cuda_max_allocated_bytes = 10, 30, 7
    a = aggregate(records, resamples=0)
    assert (a.draft_s, a.verify_s) == pytest.approx((0.75, 1.5))
    assert (a.peak_rss_bytes, a.cuda_max_allocated_bytes) == (30, 7)
    none = aggregate([rec(0)], resamples=0)
    assert (none.draft_s, none.verify_s, none.peak_rss_bytes, none.cuda_max_allocated_bytes) == (None,) * 4

"""Paired statistics and the verdicts built on them: an A/A pair is indistinguishable, never crowned."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tests.support.fake_backend import SleepBackend
from specledger.records.config import parse_run_config
from specledger.bench.runner import Runner
from specledger.ledger.inputs import load_inputs, parse_inputs
from specledger.ledger.measurements import ConfigMeasurement, RequestPoint, item_grades, measurements_from_run
from specledger.ledger.cost_model import Case
from specledger.ledger.montecarlo import simulate
from specledger.ledger.paired import mcnemar, paired_speedup
from specledger.ledger.price import price_run

INPUTS = """
hardware: {price_per_device_hour: 3600}
acceptance: {retries: 1, review_minutes: 1, fix_minutes: 10, wage_per_hour: 60}
volume: {tasks_per_month: 1000}
"""


def test_mcnemar_exact_on_discordant_items():
    a = {f"q{i}": True for i in range(20)}
    b = dict(a)
    for i in range(8):
        b[f"q{i}"] = False  # A alone passes 8 items
    a["q19"] = False  # B alone passes 1
    t = mcnemar("a", a, "b", b)
    # two-sided exact binomial on 9 discordant items: 2 * P(X <= 1) = 2 * (1 + 9) / 2**9
    assert (t.items, t.a_only, t.b_only) == (20, 8, 1)
    assert t.p_value == pytest.approx(20 / 512) and t.p_value < 0.05 and "a passes more" in t.note
    same = mcnemar("a", a, "c", dict(a))
    assert same.p_value == 1.0 and "same pass/fail on all 20" in same.note


def test_paired_speedup_uses_the_same_prompts():
    # B is exactly twice as fast on every prompt, prompts differ 10x in length: the paired ratio is 2 with a
    # tight interval, and prompts only A has are left out
    a = {f"p{i}": (1.0 + 9.0 * (i % 2), 10) for i in range(20)} | {"only-a": (100.0, 1)}
    b = {f"p{i}": (s / 2, t) for i, (s, t) in ((i, a[f"p{i}"]) for i in range(20))}
    r = paired_speedup(b, a, resamples=500, seed=1)
    assert r.n == 20 and r.ratio == pytest.approx(2.0) and r.low == pytest.approx(2.0) and r.high == pytest.approx(2.0)
    assert r.low > 1.0  # the interval excludes 1: distinguishable


def _twin(name: str, grades: dict[str, bool], svc: list[float]) -> ConfigMeasurement:
    reqs = [RequestPoint(ttft_s=0.1, tpot_s=0.01, e2e_s=s, service_s=s, output_tokens=50, key=f"p{i}|t1|r0")
            for i, s in enumerate(svc)]
    return ConfigMeasurement(name=name, strategy="ar", requests_completed=len(svc), wall_s=sum(svc),
                             output_tokens=50 * len(svc), passes=sum(grades.values()), graded=len(grades),
                             requests=reqs, grades=grades, outputs="same")


def test_identical_outputs_share_their_pass_rate_draws():
    rng = random.Random(0)
    grades = {f"p{i}|r0": rng.random() < 0.5 for i in range(40)}
    svc = [1.0 + rng.random() for _ in range(40)]
    res = parse_inputs(INPUTS).base
    cases = []
    for name in ("twin-a", "twin-b"):
        m = _twin(name, grades, svc)
        cases.append((Case(name, res.central(), m.operating_point()), res, m))
    out = simulate(cases, eligible={"twin-a", "twin-b"}, samples=2000, seed=5)
    a, b = out["twin-a"].costs, out["twin-b"].costs
    assert np.std(a) > 0  # the pass rate is uncertain (20ish of 40) ...
    np.testing.assert_array_equal(a, b)  # ... but the twins draw it (and their device time) together
    assert out["twin-a"].p_cheapest == pytest.approx(0.5) and out["twin-b"].p_cheapest == pytest.approx(0.5)


def _workload(tmp_path, n):
    p = tmp_path / "w.jsonl"
    # the fake answers with the first word: half of the references match it
    p.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"word{i} please"],
                                     "reference": [f"word{i}" if i % 2 else "other"]}) + "\n" for i in range(n)))
    return str(p)


def test_a_a_pair_is_indistinguishable_and_never_cheapest_or_dominated(tmp_path):
    cfg = parse_run_config({
        "configs": [{"name": "ar-twin-a", "max_tokens": 8}, {"name": "ar-twin-b", "max_tokens": 8}],
        "workload": {"spec": _workload(tmp_path, 30)}, "load": {"concurrency": [1], "warmup": 1},
        "bootstrap": 0, "verify_curve": False, "calibration": False,
    })
    jitter = random.Random(3)
    calls: list[str] = []
    Runner(cfg, tmp_path / "run", show_progress=False,
           backend_factory=lambda bc: SleepBackend(bc, calls, lambda n, bc: 0.004 + 0.004 * jitter.random())).run()
    ledger = price_run(tmp_path / "run", load_inputs(None), samples=2000, seed=0)
    rows = {r.name: r for r in ledger.configs}
    for name, other in (("ar-twin-a", "ar-twin-b"), ("ar-twin-b", "ar-twin-a")):
        assert rows[name].verdict == "indistinguishable", rows[name].verdict_detail
        assert f"from {other}" in rows[name].verdict_detail
        # neither twin is certain to be cheaper: with the difference's 95% interval holding zero, at least ~2.5% of
        # the paired samples favour each (real sleeps: on a loaded machine one twin's can run long, so P(cheapest)
        # need not be near 1/2)
        assert 0.01 < rows[name].p_cheapest < 0.99
    assert rows["ar-twin-a"].pass_rate == rows["ar-twin-b"].pass_rate == pytest.approx(0.5)
    assert not any(b.field == "pass_rate" for b in ledger.break_even)  # identical outputs: no quality crossing
    (q,) = ledger.quality
    assert q["a_only"] == q["b_only"] == 0 and q["items"] == 30


def test_repeats_count_each_graded_item_once(tmp_path):
    """Greedy repeats are copies of one answer: 3 repeats of 10 items are 10 graded items, not 30 (the
    interval would otherwise be sqrt(3) too narrow)."""
    cfg = parse_run_config({
        "configs": [{"name": "ar", "max_tokens": 8}],
        "workload": {"spec": _workload(tmp_path, 10)}, "load": {"concurrency": [1], "warmup": 0},
        "repeats": 3, "bootstrap": 0, "verify_curve": False, "calibration": False,
    })
    calls: list[str] = []
    Runner(cfg, tmp_path / "rep", show_progress=False,
           backend_factory=lambda bc: SleepBackend(bc, calls, lambda n, bc: 0.0)).run()
    assert len(calls) == 30
    (m,) = measurements_from_run(tmp_path / "rep")
    assert (m.graded, m.passes) == (10, 5) and sorted(m.grades) == sorted(str(i) for i in range(10))
    assert m.by_kind["qa"].graded == 10 and m.by_kind["qa"].passes == 5
    row = price_run(tmp_path / "rep", load_inputs(None), samples=0).config("ar")
    assert row.pass_rate_source == "measured 5/10"
    # Jeffreys 95% interval of 5/10, not of 15/30
    assert (row.pass_low, row.pass_high) == pytest.approx((0.2235, 0.7765), abs=1e-3)


def test_repeats_that_disagree_grade_an_item_by_its_share():
    """Sampled repeats are more answers to the same item: the item passes by the share that passed, and the
    paired test counts it for the configuration with the larger share (McNemar's sign test)."""
    from specledger.records.results import RequestGrade, RequestRecord

    def rec(q, rep, passed):
        return RequestRecord(run_id="r", config="c", request_id=f"{q}|{rep}", item=rep, question_id=q,
                             category="qa", kind="qa", turn=1, turns=1, load="c=1", repeat=rep, status="ok",
                             arrival_t=0.0, end_t=1.0, grade=RequestGrade(passed=passed))

    grades = item_grades([rec("a", 0, True), rec("a", 1, False), rec("a", 2, True), rec("a", 3, True),
                          rec("b", 0, False), rec("b", 1, False)])
    assert grades == {"a": 0.75, "b": 0.0}
    t = mcnemar("x", {"a": 0.75, "b": 0.0, "c": 1.0}, "y", {"a": 0.5, "b": 0.5, "c": 1.0})
    assert (t.items, t.a_only, t.b_only) == (3, 1, 1)


def test_twins_behind_a_clearly_cheaper_configuration_name_each_other():
    """Out of the cheapest group, two configurations whose difference is not material still say so; a
    difference that excludes zero but stays under 1% of the cost is no verdict."""
    from dataclasses import dataclass, field

    from specledger.ledger.verdicts import tested_verdicts

    @dataclass
    class R:
        name: str
        total: float
        ttft_p95: float = 1.0
        e2e_p95: float = 1.0
        comparable: bool = True
        comparable_reason: str = ""
        infinite: bool = False
        feasible: bool = True
        misses: list = field(default_factory=list)
        verdict: str = ""
        verdict_detail: str = ""

    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.05, 2000)
    costs = {"best": base * 0.5, "twin-a": base, "twin-b": base * 1.004 + rng.normal(0, 1e-4, 2000)}
    rows = [R("best", 0.5, ttft_p95=2.0), R("twin-a", 1.0), R("twin-b", 1.004)]  # the twins are faster
    tested_verdicts(rows, costs)
    v = {r.name: r for r in rows}
    assert v["best"].verdict == "cheapest"
    assert v["twin-a"].verdict == v["twin-b"].verdict == "trade-off"
    assert "indistinguishable from twin-b" in v["twin-a"].verdict_detail
    assert "indistinguishable from twin-a" in v["twin-b"].verdict_detail

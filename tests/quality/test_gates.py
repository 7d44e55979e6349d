import json

import pytest

from specledger.records.results import GateOutcome
from specledger.quality.gates import (
    comparable,
    first_divergence,
    lossless_gate,
    pass_rate_gate,
    quantization_gate,
    wilson_interval,
)


@pytest.mark.parametrize(
    "passes, n, low, high",
    [(5, 10, 0.2366, 0.7634), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (1, 1, 0.2065, 1.0)],
)
def test_wilson_interval_known_values(passes, n, low, high):
    lo, hi = wilson_interval(passes, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    a, b = wilson_interval(30, 100, z=1.0), wilson_interval(30, 100, z=2.58)
    assert b[0] < a[0] < 0.3 < a[1] < b[1]
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_pass_rate_gate_ignores_ungraded_and_reports_interval():
    g = pass_rate_gate([True] * 5 + [False] * 5 + [None] * 3)
    assert g.passed and g.name == "pass_rate"
    f = g.figures
    assert (f["passes"], f["graded"], f["ungraded"], f["rate"]) == (5, 10, 3, 0.5)
    assert (f["ci_low"], f["ci_high"]) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert "5/10" in g.reason
    low = pass_rate_gate([True, False, False, False], min_rate=0.5)
    assert not low.passed and "below the minimum" in low.reason
    assert pass_rate_gate([True, True, False], min_rate=0.5).passed
    assert pass_rate_gate([None, None]).passed and pass_rate_gate([None], min_rate=0.1).passed is False
    json.dumps(g.model_dump())  # figures must serialise into run.json


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # one stopped early
    assert first_divergence([], [5]) == 0


def test_lossless_gate_figures():
    ref = {"a": [1, 2, 3, 4], "b": [5, 6, 7], "c": [8, 9], "d": [1]}
    cand = {"a": [1, 2, 3, 4], "b": [5, 6, 0], "c": [8], "e": [2]}
    g = lossless_gate(ref, cand)
    f = g.figures
    assert not g.passed
    assert (f["compared"], f["identical"]) == (3, 1)
    assert f["share_identical"] == pytest.approx(1 / 3)
    assert f["first_divergence"] == [2, 1]  # b at 2, c at 1 (in the reference's key order)
    assert (f["first_divergence_mean"], f["first_divergence_min"]) == (1.5, 1)
    assert f["diverged"] == ["b", "c"]
    assert (f["missing_in_candidate"], f["missing_in_reference"]) == (["d"], ["e"])
    assert "1/3 outputs identical" in g.reason and "token 1" in g.reason
    assert lossless_gate(ref, cand, min_share=0.3).passed
    json.dumps(g.model_dump())


def test_lossless_gate_passes_on_identical_and_fails_on_nothing_compared():
    same = {"a": [1, 2], "b": [3]}
    g = lossless_gate(same, {k: list(v) for k, v in same.items()})
    assert g.passed and g.figures["share_identical"] == 1.0 and g.figures["first_divergence_min"] is None
    assert not lossless_gate(same, {"z": [1]}).passed


def test_quantization_gate():
    assert quantization_gate(0.97, 0.01).passed
    g = quantization_gate(0.88, 0.2, max_kl=0.1)
    assert not g.passed and "88.0%" in g.reason and "KL" in g.reason
    assert g.figures["top1_agreement"] == 0.88
    with pytest.raises(ValueError):
        quantization_gate(1.2, 0.0)


def test_comparable_collects_failed_reasons():
    ok = GateOutcome(name="a", passed=True, reason="fine")
    bad1 = GateOutcome(name="lossless", passed=False, reason="2/3 identical")
    bad2 = GateOutcome(name="pass_rate", passed=False, reason="too low")
    unchecked = GateOutcome(name="lossless", passed=None, reason="not checked: sampling")
    assert comparable([ok, unchecked]) == (True, "")
    assert comparable([]) == (True, "")
    flag, reason = comparable([ok, bad1, bad2])
    assert not flag and reason == "lossless: 2/3 identical; pass_rate: too low"

"""The cost model's formulas against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.ledger.inputs import parse_inputs
from specledger.ledger.cost_model import (
    Case, OperatingPoint, compute_cost_per_call, escalation_probability, expected_attempts, maintenance_per_task,
    objective_misses, replicas_needed, task_cost, with_value,
)

BASE_YAML = """
hardware: {kind: rented, price_per_device_hour: 3.6}      # $0.001 per device-second
task:
  calls_per_task: 2
  tools: [{name: search, calls: 1, price: 0.01, latency_s: 0.5}]
acceptance: {retries: 1, review_minutes: 1, fix_minutes: 4, wage_per_hour: 60}
maintenance: {engineering_hours_per_month: 10, retraining_hours: 5, retraining_device_hours: 2, changes_per_year: 12}
volume: {tasks_per_month: 1000}
"""


def x_of(text: str = BASE_YAML) -> dict:
    return parse_inputs(text, "t.yaml").base.central()


def op(**kw) -> OperatingPoint:
    base = dict(device_seconds_per_call=2.0, output_tokens_per_call=100.0, pass_rate=0.5, requests_per_s=0.5,
                device_count=1, e2e_p50=3.0, ttft_p95=0.4, tpot_p95=0.05, e2e_p95=5.0)
    base.update(kw)
    return OperatingPoint(**base)


@pytest.mark.parametrize("q,r,attempts,esc", [
    (0.5, 0, 1.0, 0.5),  # R = 0: one attempt, escalate on failure
    (0.25, 0, 1.0, 0.75),
    (0.5, 2, 1.75, 0.125),  # 1 + 0.5 + 0.25
    (0.9, 1, 1.1, 0.01),
    (1.0, 3, 1.0, 0.0),  # q = 1: always the first attempt
])
def test_attempts_and_escalation_hand_computed(q, r, attempts, esc):
    assert expected_attempts(q, r) == pytest.approx(attempts, rel=1e-12)
    assert escalation_probability(q, r) == pytest.approx(esc, abs=1e-15)


def test_attempts_as_q_goes_to_zero_tends_to_r_plus_one_without_dividing_by_zero():
    with np.errstate(all="raise"):  # no division warnings either
        for r in (0, 1, 4):
            assert expected_attempts(0.0, r) == r + 1
            assert expected_attempts(1e-15, r) == pytest.approx(r + 1, rel=1e-12)
            assert expected_attempts(1e-6, r) == pytest.approx(sum((1 - 1e-6) ** k for k in range(r + 1)), rel=1e-12)
            assert escalation_probability(0.0, r) == 1.0


@settings(max_examples=200, deadline=None)
@given(q=st.floats(min_value=1e-12, max_value=1.0), r=st.integers(min_value=0, max_value=10))
def test_attempts_equal_the_geometric_sum(q, r):
    """Attempt k+1 happens only if the first k failed: E[attempts] = sum_{k=0..R} (1-q)^k."""
    direct = sum((1 - q) ** k for k in range(r + 1))
    assert expected_attempts(q, r) == pytest.approx(direct, rel=1e-9)
    assert escalation_probability(q, r) == pytest.approx((1 - q) ** (r + 1), rel=1e-9, abs=1e-300)


def test_vectorised_attempts_match_scalars():
    qs = np.array([0.0, 1e-12, 0.3, 1.0])
    np.testing.assert_allclose(expected_attempts(qs, 2), [expected_attempts(float(q), 2) for q in qs])


def test_cost_per_accepted_task_hand_computed():
    x = x_of()
    b = task_cost(x, op(retrains=True))
    # compute: $0.001/s x 2 s = 0.002 per call; attempt = 2 calls x 0.002 + one $0.01 search = 0.014
    assert b.cost_per_call == pytest.approx(0.002)
    assert b.attempt_cost == pytest.approx(0.014)
    # q = 0.5, R = 1: attempts 1.5, escalation 0.25
    assert b.attempts == pytest.approx(1.5) and b.escalation == pytest.approx(0.25)
    assert b.compute == pytest.approx(1.5 * 0.004) and b.tools == pytest.approx(1.5 * 0.01)
    # labour at $1/min: review 1 + 0.25 x fix 4 = 2
    assert b.labour == pytest.approx(2.0)
    # maintenance: (10 h x 60 + (5 h x 60 + 2 device-h x 3.6) x 12/12) / 1000 tasks
    assert b.maintenance == pytest.approx((600 + 307.2) / 1000)
    assert b.total == pytest.approx(0.021 + 2.0 + 0.9072)
    assert b.per_million_tokens == pytest.approx(0.002 / 100 * 1e6)
    assert b.task_latency_s == pytest.approx(2 * 3.0 + 0.5)
    assert b.compute + b.tools + b.labour + b.maintenance == pytest.approx(b.total)  # the parts are the whole


def test_retraining_only_for_trained_drafters_unless_told():
    x = x_of()
    assert maintenance_per_task(x, retrains=False) == pytest.approx(0.6)
    assert maintenance_per_task(x, retrains=True) == pytest.approx(0.9072)
    forced = with_value(x, ("maintenance", "retraining"), True)
    assert maintenance_per_task(forced, retrains=False) == pytest.approx(0.9072)
    own_wage = with_value(x, ("maintenance", "engineer_wage_per_hour"), 120.0)
    assert maintenance_per_task(own_wage, retrains=False) == pytest.approx(1.2)


def test_pass_rate_zero_is_infinite_and_said_so():
    b = task_cost(x_of(), op(pass_rate=0.0))
    assert b.infinite and math.isinf(b.total)
    assert b.attempts == 2  # the limit R + 1: defined, no division by zero
    samples = task_cost(x_of(), op(pass_rate=np.array([0.0, 0.5]))).total
    assert math.isinf(samples[0]) and samples[1] == pytest.approx(task_cost(x_of(), op()).total)


def test_cost_file_pass_rate_overrides_the_measured_one():
    x = with_value(x_of(), ("acceptance", "pass_rate"), 1.0)
    b = task_cost(x, op(pass_rate=0.1))
    assert b.attempts == 1.0 and b.escalation == 0.0


def test_owned_hardware_amortised_capital_plus_energy_times_pue():
    text = BASE_YAML.replace(
        "hardware: {kind: rented, price_per_device_hour: 3.6}      # $0.001 per device-second",
        "hardware: {kind: owned, purchase_price: 31557.6, lifetime_years: 1, utilisation: 1,"
        " power_watts: 1000, energy_price_per_kwh: 0.36, pue: 1.5}",
    )
    x = x_of(text)
    # capital: 31557.6 / (1 year x 31,557,600 s) = $0.001/s -> 0.002; energy: 1 kW x 2 s = 1/1800 kWh x 0.36 x 1.5
    assert compute_cost_per_call(x["hardware"], op()) == pytest.approx(0.002 + 0.0003)
    # the run's measured energy wins when present: 3600 J = 0.001 kWh
    assert compute_cost_per_call(x["hardware"], op(energy_j_per_call=3600.0)) == pytest.approx(0.002 + 0.00054)
    x["hardware"]["use_measured_energy"] = False
    assert compute_cost_per_call(x["hardware"], op(energy_j_per_call=3600.0)) == pytest.approx(0.0023)
    # half utilisation doubles the capital per busy second
    x["hardware"]["utilisation"] = 0.5
    assert compute_cost_per_call(x["hardware"], op()) == pytest.approx(0.004 + 0.0003)


def test_demand_rate_priced_with_the_devices_needed():
    x = with_value(x_of(), ("volume", "demand_rps"), 10.0)
    # 3 requests/s per replica of 2 devices: ceil(10/3) = 4 replicas = 8 devices for 10 calls/s
    assert replicas_needed(10.0, 3.0, 2) == 8
    assert replicas_needed(9.0, 3.0, 1) == 3  # exact multiples do not round up
    b = task_cost(x, op(requests_per_s=3.0, device_count=2))
    assert b.cost_per_call == pytest.approx(0.001 * 8 / 10)


def test_latency_objectives():
    text = BASE_YAML + "latency: {ttft_p95_s: 0.5, tpot_p95_s: 0.04, task_s: 6}\n"
    misses = objective_misses(x_of(text), op())
    assert misses == ["p95 TPOT 0.05 s > 0.04 s", "task latency 6.5 s > 6 s"]
    assert objective_misses(x_of(text), op(ttft_p95=None, tpot_p95=0.01, e2e_p50=1.0)) == ["p95 TTFT not measured > 0.5 s"]
    assert objective_misses(x_of(), op()) == []


def test_case_cost_uses_its_inputs():
    c = Case("a", x_of(), op())
    # as test_cost_per_accepted_task_hand_computed, without retraining: maintenance 600 / 1000
    assert c.cost().total == pytest.approx(0.021 + 2.0 + 0.6)
    # pass rate 1: one attempt (2 x 0.002 + 0.01), review only (1 min at $1), no escalation
    done = c.with_op(pass_rate=1.0).cost()
    assert done.escalation == 0.0 and done.total == pytest.approx(0.014 + 1.0 + 0.6)
    assert c.op.pass_rate == 0.5  # with_op copies

"""Monte Carlo, break-even and sensitivity on small hand-made configurations."""

from __future__ import annotations

import numpy as np
import pytest

from specledger.errors import BadInput
from specledger.ledger.breakeven import break_even
from specledger.ledger.inputs import Range, parse_inputs
from specledger.ledger.measurements import ConfigMeasurement, RequestPoint
from specledger.ledger.cost_model import Case, task_cost
from specledger.ledger.montecarlo import draw_all, simulate, triangular
from specledger.ledger.sensitivity import sensitivity

POINT = """
hardware: {price_per_device_hour: 3.6}
acceptance: {retries: 0, review_minutes: 0, fix_minutes: 0, wage_per_hour: 60}
volume: {tasks_per_month: 1000}
"""


def meas(name: str, wall: float, n: int = 10, passes: int = 8, requests: bool = False, **kw) -> ConfigMeasurement:
    reqs = [RequestPoint(ttft_s=0.2, tpot_s=0.02, e2e_s=wall / n, service_s=wall / n, output_tokens=100)
            for _ in range(n)] if requests else []
    return ConfigMeasurement(name=name, strategy=kw.pop("strategy", "ar"), requests_completed=n, wall_s=wall,
                             output_tokens=100 * n, passes=passes, graded=n, requests=reqs, **kw)


def case_of(m: ConfigMeasurement, text: str = POINT) -> tuple[Case, object, ConfigMeasurement]:
    res = parse_inputs(text).base
    return Case(m.name, res.central(), m.operating_point()), res, m


def test_triangular_inverse_cdf():
    u = np.array([0.0, 0.5, 1.0])
    np.testing.assert_allclose(triangular(u, Range(low=0, mode=1, high=2)), [0, 1, 2])
    np.testing.assert_allclose(triangular(u, Range(low=3, high=3)), [3, 3, 3])
    # P(X <= mode) = (mode - low) / (high - low)
    assert triangular(np.array([0.25]), Range(low=0, mode=1, high=4))[0] == pytest.approx(1.0)


def test_point_inputs_without_per_request_data_give_a_degenerate_interval():
    c = case_of(meas("a", 20.0), POINT.replace("retries: 0,", "retries: 0, pass_rate: 0.8,"))
    out = simulate([c], eligible={"a"}, samples=500, seed=1)["a"]
    point = task_cost(c[0].x, c[0].op).total
    assert out.mean == pytest.approx(point) and out.p5 == pytest.approx(point) and out.p95 == pytest.approx(point)
    assert out.p_cheapest == 1.0 and out.p_feasible == 1.0


def test_mean_over_a_triangular_wage_matches_the_analytic_mean():
    text = POINT.replace("review_minutes: 0", "review_minutes: 10").replace("wage_per_hour: 60",
                                                                           "wage_per_hour: {low: 30, mode: 60, high: 150}")
    text = text.replace("retries: 0,", "retries: 0, pass_rate: 1,")
    c = case_of(meas("a", 20.0), text)
    out = simulate([c], eligible={"a"}, samples=20000, seed=0)["a"]
    # cost is linear in the wage: mean cost = cost at the mean wage (30 + 60 + 150) / 3 = 80
    compute = 0.001 * 2.0
    assert out.mean == pytest.approx(compute + 10 * 80 / 60, rel=0.01)
    assert out.p5 < compute + 10 * 60 / 60 < out.p95


def test_pass_rate_uncertainty_widens_the_interval():
    text = POINT.replace("fix_minutes: 0", "fix_minutes: 30")
    a = case_of(meas("a", 20.0, n=10, passes=8, requests=True), text)
    b = case_of(meas("b", 10.0, n=10, passes=7, requests=True), text)
    res = simulate([a, b], eligible={"a", "b"}, samples=4000, seed=3)
    assert res["a"].p95 > res["a"].p5 and res["b"].p95 > res["b"].p5
    # a clearly dearer configuration (same quality, 100x the device time, expensive devices) is never cheapest
    c = case_of(meas("c", 2000.0, n=10, passes=8, requests=True), text.replace("3.6", "3600"))
    res = simulate([a, c], eligible={"a", "c"}, samples=2000, seed=3)
    assert res["a"].p_cheapest == 1.0 and res["c"].p_cheapest == 0.0


def test_p_cheapest_matches_the_analytic_probability():
    """a: 2 s/call ($0.002), no retraining. b: EAGLE at 1 s/call ($0.001) plus retraining of h hours, h ~ tri(0, 0, 10),
    i.e. h x $60 x 12 changes/year / 12 / 300,000 tasks = $0.0002 h per task. b is cheaper iff h < 5, which has
    probability 1 - (1 - 5/10)^2 = 0.75; b's mean cost is 0.001 + 0.0002 x E[h] = 0.001 + 0.0002 x 10/3."""
    text = """
hardware: {price_per_device_hour: 3.6}
acceptance: {retries: 0, pass_rate: 1, review_minutes: 0, fix_minutes: 0, wage_per_hour: 60}
maintenance: {engineering_hours_per_month: 0, retraining_hours: {low: 0, mode: 0, high: 10},
              retraining_device_hours: 0, changes_per_year: 12}
volume: {tasks_per_month: 300000}
"""
    a = case_of(meas("a", 20.0), text)
    b = case_of(meas("b", 10.0, strategy="eagle"), text)
    res = simulate([a, b], eligible={"a", "b"}, samples=4000, seed=3)
    assert res["b"].p_cheapest == pytest.approx(0.75, abs=0.03)  # binomial sd 0.007
    assert res["a"].p_cheapest == pytest.approx(0.25, abs=0.03)
    assert res["b"].mean == pytest.approx(0.001 + 0.0002 * 10 / 3, rel=0.02)
    assert res["a"].mean == pytest.approx(0.002) and res["a"].p5 == res["a"].p95


def test_break_even_on_pass_rate_matches_the_closed_form():
    # Many retries, no labour: attempts = (1 - (1-q)^201) / q = 1/q to 1e-40, cost = attempt cost / q.
    # A: 4 s/call, B: 2 s/call at q_B = 0.4: A ties B when 0.004 / q = 0.002 / 0.4, i.e. q = 0.8.
    text = POINT.replace("retries: 0,", "retries: 200,")
    a, _, _ = case_of(meas("a", 40.0, passes=9), text)
    b, _, _ = case_of(meas("b", 20.0, passes=4), text)
    be = break_even(a, b, "pass_rate")
    assert be.value == pytest.approx(0.8, rel=1e-9)
    assert be.current == pytest.approx(0.9)
    assert "a is cheaper above 0.8" in be.note
    # at the solution both cost the same
    assert task_cost(a.x, a.with_op(pass_rate=be.value).op).total == pytest.approx(b.cost().total)


def test_break_even_on_an_input_path_and_no_crossing():
    text = POINT.replace("fix_minutes: 0", "fix_minutes: 10").replace("retries: 0", "retries: 1")
    # A is faster (cheaper compute) but fails more (more escalations): the wage decides.
    a, _, _ = case_of(meas("a", 2.0, passes=5), text)
    b, _, _ = case_of(meas("b", 200.0, passes=9), text)
    be = break_even(a, b, "acceptance.wage_per_hour")
    assert be.value is not None and 0 < be.value < 600
    ca = task_cost({**a.x, "acceptance": {**a.x["acceptance"], "wage_per_hour": be.value}}, a.op).total
    cb = task_cost({**b.x, "acceptance": {**b.x["acceptance"], "wage_per_hour": be.value}}, b.op).total
    assert ca == pytest.approx(cb, rel=1e-9)
    # review minutes cost both the same: no crossing, and it says who is cheaper
    be = break_even(a, b, "acceptance.review_minutes")
    assert be.value is None and "cheaper across" in be.note
    with pytest.raises(BadInput, match="no such input"):
        break_even(a, b, "acceptance.nope")
    with pytest.raises(BadInput, match="concurrency sweep"):
        break_even(a, b, "concurrency")


def test_break_even_on_concurrency_interpolates_the_sweep():
    # A serves 0.25 requests/s at c=1 and 1.0 at c=4 (linear between): device-seconds per call = 1 / r(c).
    # B takes 2 s per call: A ties B where r(c) = 0.5, i.e. c = 2.
    a, _, _ = case_of(meas("a", 20.0))
    a.sweep = [(1.0, 0.25), (4.0, 1.0)]
    b, _, _ = case_of(meas("b", 20.0))
    be = break_even(a, b, "concurrency")
    assert be.value == pytest.approx(2.0, rel=1e-6)
    assert (be.lo, be.hi) == (1.0, 4.0)


def test_sensitivity_ranks_inputs_and_uses_their_ranges():
    text = POINT.replace("review_minutes: 0", "review_minutes: {low: 1, mode: 2, high: 10}").replace(
        "price_per_device_hour: 3.6", "price_per_device_hour: {low: 3, mode: 3.6, high: 4}")
    c, res, m = case_of(meas("a", 20.0, requests=True), text)
    swings = sensitivity(c, res, m)
    assert swings[0].path == "acceptance.review_minutes" and swings[0].basis == "range"
    assert swings[0].cost_low == pytest.approx(task_cost({**c.x, "acceptance": {**c.x["acceptance"], "review_minutes": 1}}, c.op).total)
    labels = [s.label for s in swings]
    assert "pass rate (measured)" in labels and "device-seconds per call (measured)" in labels
    wage = next(s for s in swings if s.path == "acceptance.wage_per_hour")
    assert wage.basis == "±20%" and wage.low == pytest.approx(48) and wage.high == pytest.approx(72)
    assert [s.swing for s in swings] == sorted((s.swing for s in swings), reverse=True)


OWNED = """
hardware: {kind: owned, purchase_price: 1000, lifetime_years: 3, utilisation: 1, power_watts: 300,
           energy_price_per_kwh: 0.5, pue: 1.2}
acceptance: {retries: 0, pass_rate: 1, review_minutes: 0, fix_minutes: 0, wage_per_hour: 60}
volume: {tasks_per_month: 1000}
"""


@pytest.mark.parametrize("method,spread", [("rapl (idle 20.0 W subtracted)", 0.12),
                                           ("estimated: CPU time x 2.19 W per busy CPU (...)", 0.5)])
def test_energy_is_priced_with_its_methods_spread(method, spread):
    """A counter's figure is priced with ~12% error, an estimate's with ~50%: the interval of an energy-heavy
    cost widens by the method's spread, around the same centre."""
    m = meas("a", 20.0, energy_j=20 * 3600.0 * 10, energy_method=method)  # 3.6 kJ... per call: 72 kJ
    assert m.operating_point().energy_spread == spread
    c = case_of(m, OWNED)
    out = simulate([c], eligible={"a"}, samples=20000, seed=0)["a"]
    point = task_cost(c[0].x, c[0].op).total
    assert out.mean == pytest.approx(point, rel=0.02)
    assert (out.p95 - out.p5) / point == pytest.approx(2 * 1.645 * spread, rel=0.35)  # energy is ~all of it
    none = simulate([case_of(meas("a", 20.0, energy_j=20 * 3600.0 * 10), OWNED)], eligible={"a"}, samples=2000,
                    seed=0)["a"]
    assert none.p5 == pytest.approx(none.p95)  # "unavailable": no spread claimed


def test_a_steady_level_is_priced_at_its_steady_throughput():
    """A level held until steady prices the steady requests/s and joules, not the whole level's burst."""
    burst = meas("a", 10.0, energy_j=1000.0)  # 1 req/s over the level, 100 J a request
    held = meas("a", 10.0, energy_j=1000.0, steady_req_s=0.5, steady_j_per_request=150.0)
    assert burst.operating_point().device_seconds_per_call == pytest.approx(1.0)
    op = held.operating_point()
    assert op.device_seconds_per_call == pytest.approx(2.0) and op.requests_per_s == pytest.approx(0.5)
    assert op.energy_j_per_call == pytest.approx(150.0)


def test_break_even_on_concurrency_compares_both_at_the_same_level():
    """A is faster than B at every level measured, though slower at c=1 than B at c=4: no crossing (A is never
    "cheaper above" some level only because B was priced at its best level)."""
    a, _, _ = case_of(meas("a", 20.0))
    a.sweep = [(1.0, 0.3), (4.0, 1.2)]
    b, _, _ = case_of(meas("b", 20.0))
    b.sweep = [(1.0, 0.25), (4.0, 1.0)]
    b = b.with_op(device_seconds_per_call=1.0, requests_per_s=1.0)  # priced at its c=4 level
    be = break_even(a, b, "concurrency")
    assert be.value is None and "a is cheaper across [1, 4] (both at the same concurrency)" in be.note
    # B swept over other levels only: the comparison stops at the levels both measured
    b.sweep = [(2.0, 0.5), (8.0, 2.0)]
    assert (break_even(a, b, "concurrency").lo, break_even(a, b, "concurrency").hi) == (2.0, 4.0)


def test_an_unkeyed_configuration_resamples_its_own_service_times():
    """Requests without prompt keys share no draw: each configuration resamples its own, so varied service times
    spread device seconds per call (and the cost) around the measured value; identical ones leave it a point."""
    text = POINT.replace("retries: 0,", "retries: 0, pass_rate: 1,")
    varied = meas("a", 20.0, requests=True)
    varied.requests = [r.model_copy(update={"service_s": s})
                       for r, s in zip(varied.requests, [0.5, 1.0, 1.5, 2.0, 2.5, 1.5, 2.5, 3.0, 2.0, 3.5])]
    assert not any(r.key for r in varied.requests)
    measured = varied.operating_point().device_seconds_per_call
    [(_, op)] = draw_all([case_of(varied, text)], samples=4000, seed=5)
    dev = np.asarray(op.device_seconds_per_call)
    assert dev.shape == (4000,) and dev.std() > 0.1 * measured  # the ratio is not stuck at 1
    assert dev.mean() == pytest.approx(measured, rel=0.02)
    spread = simulate([case_of(varied, text)], eligible={"a"}, samples=4000, seed=5)["a"]
    flat = simulate([case_of(meas("a", 20.0, requests=True), text)], eligible={"a"}, samples=4000, seed=5)["a"]
    assert flat.p95 == pytest.approx(flat.p5)
    assert spread.p95 - spread.p5 > 0.2 * spread.mean


def test_failed_requests_lower_the_sampled_pass_rate_as_they_lower_the_central_one():
    """15 graded items, 12 passed, and 5 requests that failed (each a failed attempt): the central pass rate is
    12/20 = 0.60, and the Monte Carlo's draws centre there too (not on 12/15), so a configuration that fails
    requests is no cheaper in its interval, P(cheapest) and verdicts than at its centre."""
    grades = {f"q{i}": float(i < 12) for i in range(15)}
    m = ConfigMeasurement(name="a", strategy="ar", requests_completed=15, requests_failed=5, wall_s=20.0,
                          output_tokens=1500, grades=grades, passes=12, graded=20)
    [(_, op)] = draw_all([case_of(m)], samples=4000, seed=2)
    assert m.operating_point().pass_rate == pytest.approx(0.60)
    assert float(np.mean(op.pass_rate)) == pytest.approx(0.60, abs=0.02)

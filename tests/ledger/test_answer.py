"""The answer first (ledger/answer.py, ledger/thresholds.py): what to run, what it costs, what it saves, how sure,
why configurations tie and from which review time the decoding choice matters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from specledger.ledger.inputs import parse_inputs
from specledger.ledger.price import LedgerResult, price_run
from specledger.ledger import verdicts
from tests.ledger.test_ledger_fixtures import Spec, make_run

# $0.01 per device-second; a person reviews every task at $1 a minute; every attempt passes (no escalation) and
# nothing else costs: ar pays ~$0.06 of compute per task, fast ~$0.03. The decoding choice is a 1% difference
# (verdicts.MATERIAL) of fast's cost where 0.03 = 0.01 x (0.03 + review): 2.97 minutes of review.
INPUTS = """
hardware: {price_per_device_hour: 36}
acceptance: {retries: 0, pass_rate: 1.0, review_minutes: REVIEW, fix_minutes: 0, wage_per_hour: 60}
volume: {tasks_per_month: 10000}
"""
CROSSING = 2.97


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("answer"), [Spec("ar-fp32", "ar", service_s=6.0),
                                                         Spec("fast", "lookup", service_s=3.0, tau=2.0)])


def inputs(review: float, extra: str = ""):
    return parse_inputs(INPUTS.replace("REVIEW", str(review)) + extra)


def test_labour_heavy_ties_and_says_from_which_input_the_dollars_decide(run_dir):
    from specledger.report.terminal import render_answer

    led = price_run(run_dir, inputs(10), samples=1000)
    a = led.answer.scenarios[0]
    assert a.tie and a.recommended == "ar-fp32" == a.baseline  # nothing to gain by a change: keep the baseline
    assert a.tied_with == ["fast"] and a.confidence.startswith("a tie")
    (t,) = a.tied  # fast saves ~$0.03 of ~$10: its whole 95% interval within 1%, so "the same within 1%" is true
    assert t.config == "fast" and -0.01 < t.low_pct < t.high_pct < 0 and t.within_margin
    assert a.shares["labour"] > 0.99 and "labour is 99% of the cost per task" in a.tie_reason
    # review minutes add the same dollars to both: fast's $0.03 gap never moves with them, so the review time where
    # that gap reaches 1% of the cost (~2.97 min) is the relative margin's, not a change of the choice
    review = next(t for t in a.thresholds if t.input == "acceptance.review_minutes")
    assert not review.dollars_move and review.matters_side == "" and 0.8 * CROSSING < review.value < CROSSING
    assert review.change.startswith("no change in dollars with the review time per task")
    assert "review" not in a.headline and "review time" not in a.tie_reason.split(": no configuration")[1]
    # the hardware price does move the gap (compute is what the decoding choice changes): there it matters
    price = next(t for t in a.thresholds if t.input == "hardware.price_per_device_hour")
    assert price.dollars_move and price.before == "tie" and price.after == "fast" and price.side == "above"
    assert a.headline.startswith("the decoding choice does not matter: every configuration costs $10.06 per "
                                 "accepted task within 1% (95%); keep ar-fp32; the decoding choice matters when the "
                                 "hardware price is above")
    assert price.change.split(" (now ")[0] in a.tie_reason
    assert "central costs differ" not in a.tie_reason  # ~0.3% apart: under the margin, not just within the noise
    text = render_answer(led).plain  # the terminal lists the margin's crossings apart, never as a change
    assert "no gap moves in dollars with: the review time per task" in text and "• no change in dollars" not in text


def test_no_labour_recommends_the_faster_configuration_and_prices_its_saving(run_dir):
    a = price_run(run_dir, inputs(0), samples=1000).answer.scenarios[0]
    assert a.recommended == "fast" and a.verdict == "cheapest" and not a.tie and a.confidence.startswith("clear")
    assert a.cost == pytest.approx(0.03, rel=0.1) and a.cost_low <= a.cost <= a.cost_high
    assert a.saving_per_month == pytest.approx((a.baseline_cost - a.cost) * 10000)
    assert 0 < a.saving_low < a.saving_per_month < a.saving_high
    assert a.shares["engine"] == pytest.approx(1.0)
    # the saving is all device time: speed carries it, with the same interval; the other sources add nothing
    parts = {p.source: p for p in a.sources}
    assert a.saving_from == ["speed"] and ", from speed (device time)" in a.headline
    assert parts["speed"].per_month == pytest.approx(a.saving_per_month)
    assert (parts["speed"].low, parts["speed"].high) == pytest.approx((a.saving_low, a.saving_high))
    assert all(p.per_task == 0 and not p.evidence for p in (parts["quality"], parts["energy"], parts["rest"]))
    # no review in this scenario: its review time is not searched for a threshold
    assert "the review time per task: 0 in this scenario" in a.not_searched
    assert not any(t.input == "acceptance.review_minutes" for t in a.thresholds)
    # the wage acts like the review time (labour = minutes x wage): at 0 minutes it cannot change anything
    wage = next(t for t in a.thresholds if t.input == "acceptance.wage_per_hour")
    assert wage.value is None and wage.change.startswith("no change")


def test_the_curve_holds_each_configuration_against_review_minutes(run_dir):
    a = price_run(run_dir, inputs(0.5), samples=500).answer.scenarios[0]
    series = {s.config: s.points for s in a.curve}
    assert set(series) == {"ar-fp32", "fast"}
    xs = [p.x for p in series["fast"]]
    assert xs == sorted(xs) and xs[0] == 0 and 0.5 in xs
    for p_ar, p_fast in zip(series["ar-fp32"], series["fast"]):
        assert p_ar.cost == pytest.approx(p_fast.cost + 0.03, rel=0.15)  # labour is the same for both
        assert p_fast.low <= p_fast.cost <= p_fast.high
        assert p_fast.cost == pytest.approx(0.03 + p_fast.x, rel=0.1)


def test_a_clear_three_percent_gap_gets_a_verdict():
    """A 3% difference with a tight interval is a verdict (the 1% margin must not creep up unnoticed)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.05, 2000)
    rows = [SimpleNamespace(name=n, comparable=True, comparable_reason="", infinite=False, feasible=True, misses=[],
                            total=t, ttft_p95=1.0, e2e_p95=1.0, verdict="", verdict_detail="")
            for n, t in (("a", 1.0), ("b", 1.03))]
    verdicts.tested_verdicts(rows, {"a": base, "b": base * 1.03 + rng.normal(0, 0.001, 2000)})
    assert rows[0].verdict == "cheapest" and rows[1].verdict == "dominated"


def test_shares_put_tools_and_energy_apart_from_the_engine(run_dir):
    extra = "task: {tools: [{name: retrieval, calls: 1, price: 0.09}]}\n"
    led = price_run(run_dir, inputs(0, extra), samples=0)
    r = next(c for c in led.configs if c.name == "fast")
    s = r.cost_shares
    assert s["tools"] == pytest.approx(0.75, rel=0.05) and s["engine"] == pytest.approx(0.25, rel=0.15)
    assert sum(s.values()) == pytest.approx(1.0) and s["energy"] == 0  # rented: energy is in the rent
    from rich.console import Console

    from specledger.report.terminal import render_cost_table

    console = Console(width=80, record=True, color_system=None)
    console.print(render_cost_table(led))
    expected = f"{s['engine']:.0%}/{s['tools']:.0%}/0%/0%"
    assert expected in console.export_text() and "/0%/0%" in expected and expected.startswith("2")
    owned = parse_inputs(INPUTS.replace("REVIEW", "0").replace(
        "hardware: {price_per_device_hour: 36}",
        "hardware: {kind: owned, purchase_price: 1000, lifetime_years: 1, utilisation: 1, power_watts: 3600000, "
        "energy_price_per_kwh: 1, pue: 1}"))
    r = next(c for c in price_run(run_dir, owned, samples=0).configs if c.name == "fast")
    # 3.6 MW for ~3 s: ~3 kWh = ~$3 of energy next to ~$0.0001 of capital
    assert r.cost_shares["energy"] > 0.99 and r.energy == pytest.approx(r.compute, rel=0.01)


def test_the_human_baseline(run_dir):
    a = price_run(run_dir, inputs(0, "human: {minutes: 3}\n"), samples=0).answer.scenarios[0]
    assert a.human_cost == pytest.approx(3.0)  # 3 minutes at the reviewers' $60/h
    fast = next(h for h in a.human if h.config == "fast")
    assert fast.ratio == pytest.approx(fast.cost / 3.0) and fast.saving_per_task == pytest.approx(3.0 - fast.cost)
    a = price_run(run_dir, inputs(0, "human: {minutes: 3, wage_per_hour: 120}\n"), samples=0).answer.scenarios[0]
    assert a.human_cost == pytest.approx(6.0)
    assert price_run(run_dir, inputs(0), samples=0).answer.scenarios[0].human == []


def test_every_scenario_is_answered_and_cost_leads_with_it(run_dir, tmp_path):
    from specledger.cli import ledger as commands

    cost = tmp_path / "cost.yaml"
    cost.write_text(INPUTS.replace("REVIEW", "10") + "scenarios: {reviewed: {}, automated: {acceptance: "
                                                     "{review_minutes: 0}}}\n")
    app = typer.Typer()
    commands.register(app)
    out = tmp_path / "ledger.json"
    result = CliRunner().invoke(app, ["cost", str(run_dir), "--inputs", str(cost), "--json", str(out),
                                      "--samples", "500"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert result.output.startswith("The answer")
    assert result.output.index("reviewed: the decoding choice does not matter") < result.output.index(
        "automated: run fast") < result.output.index("Cost per accepted task")
    ledger = LedgerResult.model_validate_json(out.read_text())
    assert [s.scenario for s in ledger.answer.scenarios] == ["reviewed", "automated"]
    assert json.loads(out.read_text())["answer"]["scenarios"][1]["recommended"] == "fast"


def test_a_tie_the_review_time_cannot_break_borrows_the_threshold_of_another_scenario():
    from specledger.ledger.answer import Answer, ScenarioAnswer, Threshold, link_scenarios

    review = "acceptance.review_minutes"
    held = ScenarioAnswer(scenario="reviewed", tie=True, headline="h", tie_reason="r",
                          thresholds=[Threshold(input=review, label="review", value=None)])
    auto = ScenarioAnswer(scenario="automated", thresholds=[Threshold(input=review, label="review", value=0.2,
                                                                      low=0.2, high=0.6, matters_side="below")])
    own = ScenarioAnswer(scenario="own", tie=True, thresholds=[Threshold(input=review, label="review", value=0.1,
                                                                         matters_side="below")])
    link_scenarios(Answer(scenarios=[held, auto, own]))
    assert own.headline == "" and own.tie_reason == ""  # it has its own review threshold
    note = "the decoding choice matters when the review time per task is below 12 s (95%: 12 s–36 s)"
    assert note in held.tie_reason and "In the automated scenario the decoding choice matters" in held.headline
    assert auto.headline == "" and auto.tie_reason == ""


def test_a_pass_rate_wobble_is_priced_at_one_pass_rate(tmp_path):
    """One item of 20 graded apart (10 vs 11: no difference shown): both are priced at the reference's pass rate, so
    the ~10% gap in cost per task that escalations would make of it is not there; they tie within 1%."""
    run = make_run(tmp_path, [Spec("ar-fp32", "ar", passes=10), Spec("ar-w4", "ar", quant="int4", passes=11)])
    text = INPUTS.replace("REVIEW", "0.5").replace("pass_rate: 1.0, ", "").replace("fix_minutes: 0", "fix_minutes: 10")
    led = price_run(run, parse_inputs(text), samples=1000, thresholds=False)
    a = led.answer.scenarios[0]
    (q,) = led.quality
    assert (q["config_b"], q["decision"], q["priced_at"], q["b_only"], q["a_only"]) == ("ar-w4", "same", "shared", 1, 0)
    w4 = led.config("ar-w4")
    assert w4.pass_rate == led.config("ar-fp32").pass_rate == 0.5 and w4.quality == "same"
    assert a.tie and "central costs differ" not in a.tie_reason and a.tied[0].within_margin

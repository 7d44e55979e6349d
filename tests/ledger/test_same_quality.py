"""Quality decided once (ledger/same_quality.py) and the saving split by source (ledger/saving_sources.py): a
pass-rate gap the paired test does not support saves nothing in the headline; one it does is named as the source.

The runs are what `make demo` records for two autoregressive targets: 7 prompts with their service times (int4 a
little faster than fp32, both sharing each prompt's difficulty) and 272 graded items, priced with the package's
example costs (a person reviews every task; and a fully-automated scenario)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rich.console import Console

from specledger.ledger.answer import amount, money, signed_pct
from specledger.ledger.inputs import load_inputs
from specledger.ledger.measurements import ConfigMeasurement, RequestPoint
from specledger.ledger.price import LedgerResult, price_measurements
from specledger.ledger.same_quality import decide
from specledger.report.terminal import render_answer, render_cost_table, render_scenario

ITEMS = 272


def _config(name: str, precision: str, speed: float, passed: set[int], seed: int = 0,
            noise: float = 0.03) -> ConfigMeasurement:
    rng = np.random.default_rng(seed)
    difficulty = np.random.default_rng(99).uniform(2.0, 8.0, 7)  # the same prompts under both
    svc = difficulty * rng.lognormal(0.0, noise, 7) / speed
    reqs = [RequestPoint(ttft_s=0.5, tpot_s=s / 48, e2e_s=float(s), service_s=float(s), output_tokens=48,
                         key=f"p{i}|t1|r0") for i, s in enumerate(svc)]
    grades = {f"g{i}": float(i in passed) for i in range(ITEMS)}
    return ConfigMeasurement(name=name, strategy="ar", precision=precision, load="c=1", concurrency=1,
                             requests_completed=7, wall_s=float(svc.sum()), output_tokens=48 * 7,
                             tok_s=48 * 7 / float(svc.sum()), requests=reqs, passes=sum(grades.values()),
                             graded=ITEMS, grades=grades, ttft_p95=0.5, tpot_p95=float(svc.max() / 48),
                             e2e_p95=float(svc.max()), outputs=name)


def _run(fp32_passed: set[int], w4_passed: set[int]) -> LedgerResult:
    ms = [_config("ar-fp32", "fp32", 1.0, fp32_passed, seed=1), _config("ar-w4", "W4A32-g32", 1.15, w4_passed, seed=2)]
    return price_measurements(ms, load_inputs(None), samples=1000, seed=0)


# the demo's: fp32 124 of 272, int4 132, 4 vs 12 discordant (exact McNemar p=0.077)
DEMO = (set(range(124)), set(range(4, 136)))
# quality that truly differs: 120 vs 200 of 272, every discordant item int4's
BETTER = (set(range(120)), set(range(200)))


@pytest.fixture(scope="module")
def demo() -> LedgerResult:
    return _run(*DEMO)


@pytest.fixture(scope="module")
def better() -> LedgerResult:
    return _run(*BETTER)


def test_the_demo_kind_of_gap_is_no_quality_difference_and_saves_nothing_through_the_pass_rate(demo):
    (q,) = demo.quality
    assert (q["a_only"], q["b_only"], q["items"]) == (4, 12, ITEMS) and q["p_value"] == pytest.approx(0.0768, abs=1e-3)
    assert q["decision"] == "same" and q["priced_at"] == "shared" and q["low"] < 0 < q["high"]
    w4, fp32 = demo.config("ar-w4"), demo.config("ar-fp32")
    assert w4.pass_rate == fp32.pass_rate == pytest.approx(124 / 272) and w4.quality == "same"
    assert demo.calculator["configs"][1]["op"]["pass_rate"] == pytest.approx(124 / 272)  # the page prices it so too
    for a in demo.answer.scenarios:
        assert "quality" not in a.saving_from, a.headline
        quality = next((p for p in a.sources if p.source == "quality"), None)
        assert quality is None or (quality.per_task == 0 and not quality.evidence)
    reviewed = demo.answer.scenarios[0]
    # a person reviews every task: ~$0.0003 of device time a task is far under 1% of the cost: keep the baseline
    assert reviewed.scenario == "human-reviewed" and reviewed.recommended == "ar-fp32" and "saving" not in reviewed.headline


def test_a_quality_difference_the_paired_test_shows_is_the_saving_s_named_source(better):
    (q,) = better.quality
    assert q["decision"] == "better" and q["priced_at"] == "own" and q["low"] > 0.25
    assert better.config("ar-w4").pass_rate == pytest.approx(200 / 272)
    assert better.config("ar-fp32").pass_rate == pytest.approx(120 / 272)
    for a in better.answer.scenarios:
        assert a.recommended == "ar-w4" and a.saving_from[0] == "quality", a.headline
        assert "from quality (ar-w4 passes more graded items than ar-fp32)" in a.headline
        assert a.quality_decision == "better" and "quality differs" in a.quality
        parts = {p.source: p for p in a.sources}
        assert parts["quality"].evidence and parts["quality"].low > 0
        assert sum(p.per_task for p in a.sources) == pytest.approx(a.saving_per_task)  # the parts add up


def test_the_non_inferiority_margin_decides_same_against_not_shown():
    ref = {f"g{i}": float(i < 124) for i in range(ITEMS)}
    close = ref | {f"g{i}": 0.0 for i in range(4)} | {f"g{i}": 1.0 for i in range(124, 136)}
    worse = ref | {f"g{i}": 0.0 for i in range(20)} | {f"g{i}": 1.0 for i in range(124, 136)}  # 12 vs 20: -2.9 points
    assert decide("ar-fp32", ref, "ar-w4", close).decision == "same"
    d = decide("ar-fp32", ref, "ar-w4", worse)
    assert d.decision == "not shown" and d.shared and d.low < -d.margin < d.difference < 0 < d.high
    assert decide("ar-fp32", ref, "eagle", dict(ref), "ar-fp32").note.endswith("(eagle's graded answers are "
                                                                              "ar-fp32's: lossless)")


def _quoted(text: str) -> tuple[list[str], list[str]]:
    """The dollar amounts and percentages a sentence quotes."""
    return re.findall(r"-?\$[\d,.]+(?:e-?\d+)?", text), re.findall(r"[-+]?\d[\d.]*%", text)


@pytest.mark.parametrize("run", ["demo", "better"])
def test_every_number_the_answer_quotes_is_in_ledger_json(run, request):
    ledger = LedgerResult.model_validate_json(request.getfixturevalue(run).model_dump_json())  # as ledger.json reads
    tables = {}
    for name in [ledger.scenario, *ledger.scenarios]:
        console = Console(width=200, record=True, color_system=None)
        console.print(render_cost_table(ledger) if name == ledger.scenario else render_scenario(ledger, name))
        tables[name] = console.export_text()
    text = render_answer(ledger)
    assert text is not None
    lines = text.plain.splitlines()
    starts = [next(i for i, line in enumerate(lines) if line == a.headline) for a in ledger.answer.scenarios]
    for a, start, end in zip(ledger.answer.scenarios, starts, starts[1:] + [len(lines)]):
        dollars = {money(v) for v in (a.cost, a.baseline_cost, a.saving_per_month, a.saving_low, a.saving_high,
                                      a.human_cost) if v is not None}
        dollars |= {money(v) for p in a.sources for v in (p.per_month, p.low, p.high) if v is not None}
        dollars |= {amount(v, t.unit).split("/")[0] for t in a.thresholds for v in (t.value, t.low, t.high, t.current)
                    if v is not None and t.unit.startswith("$")}
        pcts = {"1%", "95%"} | {signed_pct(v) for t in a.tied for v in (t.low_pct, t.high_pct)}
        first = [line for line in lines[start:end] if line == a.headline or "by source" in line]
        assert len(first) == 1 + bool(a.sources)
        for line in first:
            amounts, shares = _quoted(line)
            assert set(amounts) <= dollars, (line, set(amounts) - dollars)
            assert set(shares) <= pcts | {f"{100 * a.shares[k]:.0f}%" for k in a.shares}, line
        # the headline's central cost is the table's
        assert a.headline.count(money(a.cost)) and money(a.cost) in tables[a.scenario]


def test_a_tie_wider_than_the_margin_is_not_called_the_same_within_it():
    """Two configurations 5% apart in speed on noisy device times, fully automated (compute is the cost): the paired
    interval spans several percent either side, so the answer says they cannot be told apart and quotes it."""
    same = set(range(124))
    ms = [_config("ar-fp32", "fp32", 1.0, same, seed=1, noise=0.3), _config("ar-w8", "W8A32", 1.05, same, seed=2,
                                                                             noise=0.3)]
    auto = price_measurements(ms, load_inputs(None), samples=1000, thresholds=False).answer.scenarios[1]
    (t,) = auto.tied
    assert auto.scenario == "fully-automated" and auto.tie and not t.within_margin and t.low_pct < -0.01 < 0.01 < t.high_pct
    span = f"ar-w8 cannot be told apart from it (difference {signed_pct(t.low_pct)} to {signed_pct(t.high_pct)}, 95%)"
    assert span in auto.headline and span.replace("from it", "from ar-fp32") in auto.confidence
    assert "within" not in auto.headline + auto.confidence


def test_the_same_quality_shares_the_references_measured_retry_loop_too():
    """A measured retry loop (ledger/attempts.py) prices attempts and escalations instead of the pass rate's formula:
    where no quality difference is shown it is the reference's, like the pass rate; own failed requests stay."""
    from specledger.ledger.attempts import AttemptStats
    from specledger.ledger.price import at_same_quality

    def loop(escalated: int) -> AttemptStats:
        return AttemptStats(tasks=ITEMS, max_attempts=3, pass_at=[0.5, 0.6, 0.7], escalated=escalated,
                            device_s_first=1.0, device_s_task=1.6, tokens_task=80.0, attempts_mean=1.6)

    fp32, w4 = _config("ar-fp32", "fp32", 1.0, DEMO[0]), _config("ar-w4", "W4A32-g32", 1.15, DEMO[1])
    fp32.retry, w4.retry, w4.requests_failed = loop(80), loop(70), 2
    (_, priced), _, decisions = at_same_quality([fp32, w4])
    assert decisions["ar-w4"].shared and priced.retry == fp32.retry and priced.grades == fp32.grades
    assert priced.graded == ITEMS + 2 and priced.passes == 124


def test_a_recommendation_whose_non_inferiority_is_not_shown_says_so():
    """12 vs 20 discordant items (-2.9 points, interval reaching -6.8): no difference shown, so int4 is priced at
    fp32's pass rate and wins on speed where compute is the cost; the headline says its quality is not shown to be
    within the margin."""
    ref = set(range(124))
    ms = [_config("ar-fp32", "fp32", 1.0, ref, seed=1),
          _config("ar-w4", "W4A32-g32", 1.5, (ref - set(range(20))) | set(range(124, 136)), seed=2)]
    auto = price_measurements(ms, load_inputs(None), samples=1000, thresholds=False).answer.scenarios[1]
    assert auto.recommended == "ar-w4" and auto.quality_decision == "not shown" and auto.saving_from == ["speed"]
    assert "ar-w4's quality is not shown to be at most 5 points below ar-fp32's" in auto.headline


def test_a_tie_at_the_top_says_how_sure_in_the_headline_s_words():
    """Fully automated, int4 and int8 cannot be told apart and both beat fp32: 'how sure' names the tie as the
    headline does, with its interval."""
    same = set(range(124))
    ms = [_config("ar-fp32", "fp32", 1.0, same, seed=1), _config("ar-w8", "W8A16", 1.5, same, seed=2, noise=0.3),
          _config("ar-w4", "W4A16-g32", 1.5, same, seed=3, noise=0.3)]
    auto = price_measurements(ms, load_inputs(None), samples=1000, thresholds=False).answer.scenarios[1]
    assert not auto.tie and auto.verdict == "indistinguishable" and len(auto.tied) == 1
    (t,) = auto.tied
    words = f"{t.config} cannot be told apart from {auto.recommended} (difference {signed_pct(t.low_pct)}"
    assert auto.confidence.startswith(f"a tie at the top: {words}") and words.replace(auto.recommended, "it") in auto.headline

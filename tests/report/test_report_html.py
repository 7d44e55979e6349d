"""The HTML report is one self-contained file with every section, and `specledger report` writes it."""

from __future__ import annotations

import json
import re

import pytest
import typer
from markupsafe import escape
from typer.testing import CliRunner

from specledger.ledger.inputs import load_inputs
from specledger.ledger.price import price_run
from specledger.report.html import write_report
from specledger.report.interaction import interaction_rows
from tests.ledger.test_ledger_fixtures import DEFAULT_SPECS, Spec, make_run


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    specs = [Spec("ar-fp32", "ar", concurrency=(1, 2))] + DEFAULT_SPECS[1:] + [
        Spec("x</script><b>", "lookup", comparable=False, reason="<i>not escaped?</i>")]
    run_dir = make_run(root, specs, n=12)
    ledger = price_run(run_dir, load_inputs(None), samples=200)
    path = write_report(run_dir, ledger, root / "out" / "report.html")
    return ledger, path.read_text(encoding="utf-8")


def test_self_contained(report):
    _, html = report
    assert "<script src" not in html and "<link rel=\"stylesheet\"" not in html and "<img" not in html
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    # only XML namespace identifiers (names, never fetched)
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert "@import" not in html and not re.search(r"url\(\s*['\"]?(?!#)", html)  # only url(#local-id)


def test_every_section_is_there(report):
    ledger, html = report
    for section in ('id="cost-table"', 'id="calc-form"', 'id="calc-table"', 'id="calc-chart"', 'id="break-even"',
                    'id="chart-sensitivity"', 'id="interaction"', 'id="chart-interaction"', 'id="chart-speedup_by_kind"',
                    'id="chart-tau_by_kind"', 'id="chart-latency"', 'id="chart-concurrency"', 'id="levels-table"'):
        assert section in html, section
    assert html.count("<svg") >= 6  # static charts; the calculator draws its own in the page
    assert "recorded no verification-cost curve" in html  # said, not silently dropped
    for r in ledger.configs:
        if r.total is not None:
            assert f'data-value="{r.total!r}"' in html


def test_untrusted_names_are_escaped_and_the_data_parses(report):
    _, html = report
    assert "x</script><b>" not in html and "<i>not escaped?</i>" not in html
    blob = re.search(r'<script type="application/json" id="ledger-data">(.*?)</script>', html, re.S).group(1)
    data = json.loads(blob)
    assert {c["name"] for c in data["calculator"]["configs"]} >= {"ar-fp32", "x</script><b>"}


def test_interaction_is_measured_never_multiplied(report):
    ledger, html = report
    rows = {(r["strategy"], r["precision"]): r for r in interaction_rows(ledger)}
    tok = {m.name: m.tok_s for m in ledger.measurements if m.load == "c=1"}
    eagle_w4 = rows[("eagle", "W4A32-g32")]
    assert eagle_w4["speedup"] == pytest.approx(tok["eagle-w4"] / tok["ar-w4"])
    assert eagle_w4["vs_reference"] == pytest.approx(tok["eagle-w4"] / tok["ar-fp32"])
    assert ("lookup", "W4A32-g32") not in rows  # not run, so not shown as a number
    assert "not measured" in html


def test_report_command(tmp_path):
    from specledger.cli import report as commands

    run_dir = make_run(tmp_path, DEFAULT_SPECS[:2], n=6)
    app = typer.Typer()
    app.callback()(lambda: None)  # a command group, as in the real CLI
    commands.register(app)
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", str(run_dir), "-o", str(out), "--samples", "100"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert out.exists() and "report:" in result.output
    default = CliRunner().invoke(app, ["report", str(run_dir), "--samples", "0"])
    assert default.exit_code == 0, default.output
    assert (run_dir / "report.html").exists()


def test_quality_items_column_is_the_count(report):
    """Issue 43: the column printed `<built-in method items of dict ...>` (Jinja's q.items is the dict method)."""
    ledger, html = report
    assert "built-in method" not in html
    body = re.search(r'<table id="quality-tests">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
    assert cells and [int(c[2]) for c in cells] == [q["items"] for q in ledger.quality]


def test_the_answer_block_leads_the_report(report):
    ledger, html = report
    assert ledger.answer is not None
    start = html.index('<section id="answer"')
    assert start < html.index("<table") and start < html.index('class="chart') and start < html.index('<h2 id="cost"')
    block = html[start:html.index("</section>", start)]
    for sa in ledger.answer.scenarios:
        assert f'data-scenario="{sa.scenario}"' in block
        assert f'<b class="answer-config">{sa.recommended}</b>' in block
    assert block.count("<svg") == sum(1 for sa in ledger.answer.scenarios if sa.curve)  # cost vs review minutes


def test_shares_are_the_ledgers_five_way_split(report):
    """Engine, tools, labour, maintenance, energy: tool calls are no longer counted as compute."""
    ledger, html = report
    for r in ledger.configs:
        if r.total is None:
            continue
        row = re.search(rf'<tr data-config="{re.escape(str(escape(r.name)))}"[^>]*>(.*?)</tr>', html, re.S).group(1)
        want = " · ".join(f"{100 * r.cost_shares[k]:.0f}" for k in ("engine", "tools", "labour", "maintenance", "energy"))
        assert want in row, (r.name, want)


def test_without_the_ledgers_answer_the_verdicts_still_lead(report, tmp_path):
    """A ledger result from before the answer block: the report still opens on the recommendation, taken from
    the tested verdicts (the cheapest, else the lowest of the tied), and claims nothing the ledger did not say."""
    ledger, _ = report
    old = ledger.model_copy(update={"answer": None})
    html = write_report(old.run_dir, old, tmp_path / "old.html").read_text(encoding="utf-8")
    rows = [r for r in old.configs if r.verdict in ("cheapest", "indistinguishable") and r.total is not None]
    best = min(rows, key=lambda r: (r.verdict != "cheapest", r.total))
    block = html[html.index('<section id="answer"'):html.index("</section>")]
    assert f'<b class="answer-config">{best.name}</b>' in block and "computed no answer block" in block
    assert html.index('<section id="answer"') < html.index("<table")


def test_the_verdict_legend_states_the_rule(report):
    """Issue 43: the legend said "straddles zero"; the rule is a difference beyond 1% of the cost (verdicts.py)."""
    from specledger.ledger.verdicts import MATERIAL

    _, html = report
    assert "straddles zero" not in html
    assert f"<b>indistinguishable</b> = the difference from the lowest cost is within {MATERIAL:.0%} of the cost" in html

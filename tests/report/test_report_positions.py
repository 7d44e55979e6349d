"""Acceptance per draft position in the HTML report: per configuration and load level, from the servers'
counters and from per-request statistics, as the run recorded them (report/positions.py)."""

from __future__ import annotations

import re

from specledger.records.results import load_run, write_run
from specledger.spec_stats import LevelStats
from specledger.ledger.inputs import load_inputs
from specledger.ledger.price import price_run
from specledger.report.html import write_report
from specledger.report.positions import position_rows
from tests.ledger.test_ledger_fixtures import DEFAULT_SPECS, make_run


def _table(html: str) -> list[list[str]]:
    body = re.search(r'<table id="positions-table">(.*?)</table>', html, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)] for r in rows]


def test_positions_per_configuration_and_level_in_the_report(tmp_path):
    run_dir = make_run(tmp_path, DEFAULT_SPECS, n=8)
    run = load_run(run_dir)
    spec = next(c for c in run.configs if c.strategy != "ar")
    first, last = spec.loads[0], spec.loads[-1]
    first.telemetry_levels = [LevelStats(name="llamacpp", proposed=102, accepted=70, rate=70 / 102, drafts=20,
                                              accepted_per_position=[18, 12, 12, 10, 10, 8],
                                              position_rates=[0.9, 0.6, 0.6, 0.5, 0.5, 0.4])]
    last.aggregate.acceptance = [LevelStats(name="draft", proposed=30, accepted=12, rate=0.4, drafts=10,
                                                 accepted_per_position=[7, 4, 1], position_rates=[0.7, 0.4, 0.1])]
    write_run(run_dir, run)
    assert [(r.config, r.load, r.source) for r in position_rows(load_run(run_dir))] == [
        (spec.name, first.load, "server counters: llamacpp"), (spec.name, last.load, "per request: draft")]
    ledger = price_run(run_dir, load_inputs(None), samples=0)
    html = write_report(run_dir, ledger, tmp_path / "r.html").read_text(encoding="utf-8")
    header, *rows = _table(html)
    assert header[5:] == [f"pos {i}" for i in range(1, 7)]
    assert rows[0] == [spec.name, first.load, "server counters: llamacpp", "20", "70 / 102",
                       "90%", "60%", "60%", "50%", "50%", "40%"]
    assert rows[1] == [spec.name, last.load, "per request: draft", "10", "12 / 30", "70%", "40%", "10%", "–", "–", "–"]
    assert 'style="background-size: 90% 70%"' in html  # the bar follows the rate


def test_no_positions_is_said(tmp_path):
    run_dir = make_run(tmp_path, DEFAULT_SPECS, n=8)
    html = write_report(run_dir, price_run(run_dir, load_inputs(None), samples=0), tmp_path / "r.html").read_text()
    assert 'id="positions-table"' not in html and "No configuration reported acceptance per draft position" in html

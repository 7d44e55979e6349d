"""The terminal output fits 80 columns with whole configuration names."""

from __future__ import annotations

import re

from rich.console import Console

from specledger.ledger.inputs import load_inputs
from specledger.ledger.price import price_run
from specledger.report.terminal import print_ledger
from tests.ledger.test_ledger_fixtures import DEFAULT_SPECS, Spec, make_run


def test_cost_tables_fit_80_columns_with_whole_names(tmp_path):
    specs = DEFAULT_SPECS + [Spec("eagle-w4-long-config-name", "eagle", quant="int4", service_s=3.1, passes=12,
                                  tau=2.3),
                             Spec("lookup-w4-odd", "lookup", comparable=False, reason="lossless: 3/20 outputs differ")]
    ledger = price_run(make_run(tmp_path, specs), load_inputs(None), samples=300)
    assert ledger.scenario == "human-reviewed" and list(ledger.scenarios) == ["fully-automated"]
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    print_ledger(ledger, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "…" not in text  # nothing cut
    table = text.split("Cost per accepted task — fully-automated")[0]
    for r in ledger.configs:
        assert re.search(rf"│ {re.escape(r.name)}\s", table), r.name  # whole name in the first column
        assert r.verdict in table
    automated = text.split("Cost per accepted task — fully-automated")[1]
    for name in ("ar-fp32", "eagle-w4-long-config-name"):
        assert name in automated


def test_run_tables_fit_80_columns_with_whole_names(tmp_path):
    """`bench` and `show` at 80 columns: the run and per-category tables keep whole names and values (they
    were cut to "llama-serv…", "T…"); at a wide console the full layout keeps every column."""
    from specledger.records.results import load_run
    from specledger.bench.tables import WIDE, render_run

    specs = [Spec("llama-server-ngram-parallel4", "lookup", tau=1.7, comparable=False, reason="lossless"),
             Spec("specledger-int4-torch", "ar", service_s=95.0, ttft_s=12.5, concurrency=(1, 16))]
    run = load_run(make_run(tmp_path, specs, n=12))
    for c in run.configs:
        for lr in c.loads:
            lr.by_category = lr.by_kind
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    console.print(render_run(run, width=console.width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, max(text.splitlines(), key=len)
    assert "…" not in text
    for s in specs:
        assert re.search(rf"│ {re.escape(s.name)}\s", text), s.name  # the run table's first column
        assert f"{s.name} @c=1" in text  # the head of its block of categories
    assert "1.70" in text and "not comparable" in text  # tau whole; comparability on a line of its own
    assert re.search(r"│ *1[0-9]{4} │", text)  # a p50 TTFT of ~12.5 s (queued at c=16) whole: "12345", no decimals
    wide = Console(width=WIDE, record=True, force_terminal=False, color_system=None)
    wide.print(render_run(run, width=wide.width))
    assert "goodput" in wide.export_text() and "goodput" not in text

"""The terminal output fits 80 columns with whole configuration names."""

from __future__ import annotations

import re

from rich.console import Console

from specledger.ledger.inputs import load_inputs
from specledger.ledger.price import price_run
from specledger.report.terminal import print_ledger
from test_ledger_fixtures import DEFAULT_SPECS, Spec, make_run


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

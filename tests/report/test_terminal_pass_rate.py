"""The cost table's pass rate: its "±" is the longer side of the 95% interval, which near 100% or 0% is far from
symmetric (19 of 20 passed: 95%, the interval reaching down much further than up)."""

from __future__ import annotations

from rich.console import Console

from specledger.ledger.inputs import load_inputs
from specledger.ledger.price import price_run
from specledger.report.terminal import render_cost_table
from tests.ledger.test_ledger_fixtures import Spec, make_run


def test_the_pass_rate_plus_minus_is_the_longer_side_of_its_interval(tmp_path):
    run = make_run(tmp_path, [Spec("ar-fp32", "ar", passes=19)])
    led = price_run(run, load_inputs(None), samples=0, thresholds=False)
    r = led.configs[0]
    assert r.pass_rate is not None and r.pass_low is not None and r.pass_high is not None
    down, up = r.pass_rate - r.pass_low, r.pass_high - r.pass_rate
    assert round(100 * down) > round(100 * up) + 2, (r.pass_low, r.pass_rate, r.pass_high)  # asymmetric
    console = Console(width=80, record=True, color_system=None)
    console.print(render_cost_table(led))
    text = console.export_text()
    assert f"±{100 * down:.0f}" in text and f"±{100 * up:.0f}" not in text, text

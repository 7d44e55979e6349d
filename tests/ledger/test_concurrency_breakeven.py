"""Speed-up along the concurrency sweep, paired per prompt, and the break-even concurrency per method."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from specledger.ledger.concurrency import break_even_concurrency
from specledger.ledger.inputs import parse_inputs
from specledger.ledger.measurements import ConfigMeasurement, RequestPoint
from specledger.ledger.price import price_measurements
from specledger.report.terminal import break_even_cell

INPUTS = """
hardware: {price_per_device_hour: 1.0}
acceptance: {retries: 1, review_minutes: 1, fix_minutes: 10, wage_per_hour: 60}
volume: {tasks_per_month: 1000}
latency: {}
"""


@dataclass
class Row:
    name: str
    strategy: str
    concurrency: int | None
    speedup: float | None
    speedup_low: float | None = None
    speedup_high: float | None = None
    precision: str = "fp32"
    load: str = ""
    tok_s: float | None = None
    speedup_base: str | None = "ar"


def test_the_crossing_and_its_interval_are_read_off_the_sweep():
    rows = [Row("lookup", "lookup", 1, 1.2, 1.1, 1.3), Row("lookup", "lookup", 4, 0.8, 0.7, 0.9),
            Row("eagle", "eagle", 1, 1.3, 1.2, 1.4), Row("eagle", "eagle", 4, 1.05, 0.98, 1.1),
            Row("draft", "draft", 1, 0.9, 0.8, 0.95), Row("draft", "draft", 4, 0.7, 0.6, 0.8),
            Row("ar", "ar", 1, 1.0), Row("ar", "ar", 4, 1.0), Row("once", "lookup", 1, 1.5)]
    out = {b.config: b for b in break_even_concurrency(rows)}
    assert set(out) == {"lookup", "eagle", "draft"}  # ar is the baseline; one level is no sweep
    lk = out["lookup"]
    # log2-linear: 1.2 -> 0.8 over log2 c 0 -> 2 crosses 1 half-way, at c = 2; the low bound (1.1 -> 0.7) a
    # quarter of the way (2**0.5), the high bound (1.3 -> 0.9) three quarters (2**1.5)
    assert lk.status == "stops paying" and lk.value == pytest.approx(2.0)
    assert (lk.low, lk.high) == pytest.approx((2 ** 0.5, 2 ** 1.5))
    assert "≈ 2" in lk.note and "1.41 to 2.83" in lk.note
    assert out["eagle"].status == "pays throughout" and out["eagle"].value is None
    assert "no break-even within the levels measured" in out["eagle"].note and "above 4" in out["eagle"].note
    assert "not distinguishable from 1" in out["eagle"].note
    assert out["draft"].status == "never pays" and "below 1" in out["draft"].note
    assert break_even_cell(out["eagle"]) == "none in 1–4\n[dim]faster[/dim]"
    assert break_even_cell(out["draft"]).startswith("none in 1–4")
    # slower at c=1, faster at c=4: it starts paying where the speed-up crosses 1 upwards (half-way: c = 2)
    (up,) = break_even_concurrency([Row("x", "eagle", 1, 0.8, 0.7, 0.9), Row("x", "eagle", 4, 1.2, 1.1, 1.3)])
    assert up.status == "starts paying" and up.value == pytest.approx(2.0) and up.low < 2.0 < up.high
    assert break_even_cell(up) == "≈2\n[dim]pays above[/dim]"
    # the interval open below: the low bound already under 1 at the first level
    (b,) = break_even_concurrency([Row("x", "lookup", 1, 1.1, 0.9, 1.3), Row("x", "lookup", 8, 0.9, 0.8, 1.2)])
    assert b.low is None and b.high is None and "≤ 1 to ≥ 8" in b.note


def _level(name, strategy, c, service, occupancy, rng, tokens=50, n=20):
    """n prompts of ~`service` s each, `occupancy` of them in service at once (the level's device time is the
    summed service over it)."""
    svc = [service * float(rng.uniform(0.9, 1.1)) for _ in range(n)]
    reqs = [RequestPoint(ttft_s=0.1, tpot_s=0.01, e2e_s=s, service_s=s, output_tokens=tokens, key=f"p{i}|t1|r0")
            for i, s in enumerate(svc)]
    w = sum(svc) / occupancy
    return ConfigMeasurement(name=name, strategy=strategy, precision="fp32", load=f"c={c}", concurrency=c,
                             requests_completed=n, wall_s=w, output_tokens=tokens * n, tok_s=tokens * n / w,
                             requests=reqs, passes=10, graded=20, grades={f"g{i}": i < 10 for i in range(20)},
                             e2e_p95=max(svc), ttft_p95=0.1, tpot_p95=0.01)


def test_speedups_at_every_level_are_throughput_ratios_with_paired_intervals():
    rng = np.random.default_rng(0)
    ms = [
        _level("ar", "ar", 1, 1.0, 1, rng), _level("ar", "ar", 4, 2.0, 4, rng),  # batched: 4 in one pass
        _level("lookup", "lookup", 1, 0.8, 1, rng), _level("lookup", "lookup", 4, 2.5, 4, rng),
        # served one at a time: at c=4 requests queue, each one as fast as alone
        _level("eagle", "eagle", 1, 0.7, 1, rng), _level("eagle", "eagle", 4, 0.7, 1, rng),
    ]
    ledger = price_measurements(ms, parse_inputs(INPUTS), samples=0)
    lv = {(r.name, r.load): r for r in ledger.levels}
    for name in ("lookup", "eagle"):
        for c in (1, 4):
            r, m, base = lv[(name, f"c={c}")], next(x for x in ms if x.name == name and x.load == f"c={c}"), \
                next(x for x in ms if x.name == "ar" and x.load == f"c={c}")
            assert r.speedup == pytest.approx(m.tok_s / base.tok_s, rel=1e-9), (name, c)
            assert r.speedup_low < r.speedup < r.speedup_high and r.speedup_base == "ar"
    # the queued method: ~1.43x alone, but at c=4 it has 1 request in service against ar's batch of 4
    assert lv[("eagle", "c=4")].speedup == pytest.approx(2.0 / 0.7 / 4, rel=0.1)
    assert lv[("eagle", "c=4")].speedup_high < 1.0
    be = {b.config: b for b in ledger.concurrency}
    assert be["lookup"].status == be["eagle"].status == "stops paying"
    assert 1 < be["eagle"].value < 4 and be["lookup"].points[1].speedup == pytest.approx(0.8, rel=0.1)
    # the priced row carries the same speed-up as its level
    for r in ledger.configs:
        if r.strategy != "ar":
            assert r.speedup == lv[(r.name, r.load)].speedup


def test_the_report_and_the_terminal_show_the_sweep(tmp_path):
    import re

    from rich.console import Console

    from specledger.ledger.inputs import load_inputs
    from specledger.ledger.price import price_run
    from specledger.report.html import render_report
    from specledger.report.terminal import print_ledger
    from tests.ledger.test_ledger_fixtures import Spec, make_run

    specs = [Spec("ar-fp32", "ar", concurrency=(1, 4)), Spec("lookup-fp32", "lookup", service_s=4.5, tau=1.6,
                                                             concurrency=(1, 4)),
             Spec("eagle-w4-long-config-name", "eagle", quant="int4", service_s=3.0, tau=2.2, concurrency=(1, 4)),
             Spec("ar-w4", "ar", quant="int4", service_s=4.0, concurrency=(1, 4))]
    run_dir = make_run(tmp_path, specs)
    ledger = price_run(run_dir, load_inputs(None), samples=200)
    be = {b.config: b for b in ledger.concurrency}
    assert set(be) == {"lookup-fp32", "eagle-w4-long-config-name"}
    assert be["lookup-fp32"].status == "pays throughout" and be["lookup-fp32"].points[1].low is not None
    html = render_report(ledger, run_dir)
    table = html.split('id="concurrency-table"')[1].split("</table>")[0]
    assert 'data-config="lookup-fp32"' in table and "baseline" in table and "none in 1–4" in table
    assert re.search(r"\d\.\d\d× \[\d\.\d\d–\d\.\d\d\]", table)  # a paired interval in a cell
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    print_ledger(ledger, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    sweep = text.split("Throughput and speed-up vs concurrency")[1]
    assert re.search(r"│ eagle-w4-long-config-name\s", sweep) and "none in 1–4" in sweep

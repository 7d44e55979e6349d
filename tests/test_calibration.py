"""Noise awareness: the calibration probe's drift and the machine's load, and the warning that names them."""

from __future__ import annotations

from specledger.bench.calibration import DRIFT_WARN, assess, probe_ms
from specledger.bench.results import Noise, NoiseProbe


def _noise(ms, load=0.5, cores=2, threads=2):
    return Noise(probes=[NoiseProbe(when=w, ms=m, load_avg=[load, load, load])
                         for w, m in zip(("before", "during", "after"), ms)],
                 threads={"cpu_count": cores, "torch_threads": threads})


def test_steady_machine_no_warning():
    n = assess(_noise([2.0, 2.05, 2.02]))
    assert n.drift == (2.05 - 2.0) / 2.0 and n.warning is None


def test_drift_past_threshold_warns_naming_when():
    n = assess(_noise([2.0, 2.0 * (1 + DRIFT_WARN + 0.2), 2.1]))
    assert n.warning is not None and "drifted 30%" in n.warning and "slowest during" in n.warning


def test_load_and_oversubscription_are_named():
    n = assess(_noise([2.0, 2.0, 2.0], load=5.3, cores=2, threads=4))
    assert "load average 5.3 on 2 cores" in n.warning and "torch uses 4 threads on 2 cores" in n.warning
    assert "drift" not in n.warning


def test_probe_times_a_real_product():
    assert 0 < probe_ms(size=32, repeats=3) < 1000


def test_report_warns_naming_the_cause(tmp_path):
    from specledger.bench.results import load_run, write_run
    from specledger.ledger.inputs import load_inputs
    from specledger.ledger.price import price_run
    from specledger.report.html import render_report
    from test_ledger_fixtures import DEFAULT_SPECS, make_run

    run_dir = make_run(tmp_path, DEFAULT_SPECS[:2], n=8)
    run = load_run(run_dir)
    run.noise = assess(_noise([2.0, 3.0, 2.1], load=4.0))
    write_run(run_dir, run)
    html = render_report(price_run(run_dir, load_inputs(None), samples=100), run_dir)
    assert 'id="noise-warning"' in html and "drifted 50%" in html and "load average 4.0 on 2 cores" in html
    run.noise = assess(_noise([2.0, 2.0, 2.0]))
    write_run(run_dir, run)
    html = render_report(price_run(run_dir, load_inputs(None), samples=100), run_dir)
    assert 'id="noise-warning"' not in html and 'id="noise"' in html

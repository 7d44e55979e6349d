"""Noise awareness: the calibration probe's drift and the machine's load, and the warning that names them."""

from __future__ import annotations

import pytest

from specledger.bench import calibration
from specledger.bench.calibration import DRIFT_WARN, assess, probe_ms, settled_ms
from specledger.records.results import Noise, NoiseProbe


def _noise(ms, load=0.5, cores=2, threads=2):
    return Noise(probes=[NoiseProbe(when=w, ms=m, load_avg=[load, load, load])
                         for w, m in zip(("before", "during", "after"), ms)],
                 threads={"cpu_count": cores, "torch_threads": threads})


def test_steady_machine_no_warning():
    n = assess(_noise([2.0, 2.05, 2.02]))
    assert n.drift == (2.05 - 2.0) / 2.0 and n.warning is None


def test_drift_past_threshold_warns_naming_when_and_what_the_probe_read():
    n = assess(_noise([2.0, 2.0 * (1 + DRIFT_WARN + 0.2), 2.1]))
    assert n.warning is not None and "drifted 30%" in n.warning and "slowest during" in n.warning
    assert "(before 2.00 ms, during 2.60 ms, after 2.10 ms; slowest during the run)" in n.warning


def test_a_cold_probe_is_warmed_before_it_is_timed(monkeypatch):
    """The first products after loading weights ran 31% slow (a cold machine): the probe runs them untimed for
    WARM_S, then times rounds until two agree, so a quiet machine reads as quiet (it warned "drifted 31%, slowest
    before the run")."""
    clock = [0.0]

    def cold_for(seconds: float):
        def product():  # 1.31 ms while cold, then 1.00 ms
            clock[0] += 1.31e-3 if clock[0] < seconds else 1.0e-3
        return product

    monkeypatch.setattr(calibration.time, "perf_counter", lambda: clock[0])
    ms, first = settled_ms(cold_for(0.8 * calibration.WARM_S), repeats=21)
    assert ms == pytest.approx(1.0) and first == pytest.approx(1.0)  # warm before the first timed round
    clock[0] = 0.0
    ms, first = settled_ms(cold_for(0.04), repeats=21, warm_s=0.0)  # no untimed warm-up: rounds until two agree
    assert first == pytest.approx(1.31) and ms == pytest.approx(1.0)


def test_load_and_oversubscription_are_named():
    n = assess(_noise([2.0, 2.0, 2.0], load=5.3, cores=2, threads=4))
    assert "load average 5.3 on 2 cores" in n.warning and "torch uses 4 threads on 2 cores" in n.warning
    assert "drift" not in n.warning


def test_probe_times_a_real_product():
    ms, first = probe_ms(size=32, repeats=3)
    assert 0 < ms < 1000 and 0 < first < 1000


def test_report_warns_naming_the_cause(tmp_path):
    from specledger.records.results import load_run, write_run
    from specledger.ledger.inputs import load_inputs
    from specledger.ledger.price import price_run
    from specledger.report.html import render_report
    from tests.ledger.test_ledger_fixtures import DEFAULT_SPECS, make_run

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


def _counted(own_cores: float, others_cores: float, load: float = 2.2, cores: int = 2):
    """Probes 60 s apart in which this run kept `own_cores` busy and other processes `others_cores`."""
    probes = [NoiseProbe(when=w, ms=2.0, load_avg=[load] * 3, clock_s=60.0 * i,
                         busy_cpu_s=1000 + 60.0 * i * (own_cores + others_cores), own_cpu_s=5 + 60.0 * i * own_cores)
              for i, w in enumerate(("before", "during", "after"))]
    return Noise(probes=probes, threads={"cpu_count": cores, "torch_threads": 2})


def test_the_runs_own_threads_are_not_noise():
    """A load average over the cores from the run's own two threads (nothing else ran) is no warning."""
    n = assess(_counted(own_cores=2.0, others_cores=0.05))
    assert n.warning is None and n.probes[1].others_cores == pytest.approx(0.05)


def test_other_processes_cpu_time_warns():
    n = assess(_counted(own_cores=1.0, others_cores=1.3, load=1.0))
    assert "other processes kept 1.3 of 2 cores busy on average between the before and during probes" in n.warning
    assert "load average" not in n.warning


def test_counters_read_this_machine():
    from specledger.bench.calibration import cpu_counters

    clock, busy, own = cpu_counters()
    assert clock > 0 and busy > 0 and 0 < own <= busy


def test_the_untimed_warm_up_is_paid_once_per_process(monkeypatch):
    """A resumed run (200 of them in the crash test) must not pay a second of products per probe: the first probe
    of a process warms, the later ones only time rounds until two agree."""
    seen: list[float] = []
    monkeypatch.setattr(calibration, "_WARMED", [])
    monkeypatch.setattr(calibration, "settled_ms", lambda product, repeats, warm_s: (seen.append(warm_s), (1.0, 1.0))[1])
    probe_ms(size=8, repeats=1)
    probe_ms(size=8, repeats=1)
    assert seen == [calibration.WARM_S, 0.0]

"""Sustained mode: a level held until throughput is steady reports the steady state, not the burst."""

from __future__ import annotations

import json
import sys
import time
from collections import namedtuple
from types import SimpleNamespace

import pytest

from tests.support.fake_backend import SleepBackend
from specledger.records.config import parse_run_config
from specledger.records.results import load_run
from specledger.bench.runner import Runner
from specledger.bench.tables import steady_text
from specledger.bench.steady import SteadyStateCheck, parse_duration, read_conditions
from specledger.errors import BadInput


def test_a_throttle_is_steady_only_once_the_slow_windows_agree():
    s = SteadyStateCheck(window=1, tolerance=0.05, span=3, start=0.0)
    t = 0.0
    for k, dt in enumerate([0.1] * 4 + [0.2] * 4):  # 10 tokens a request; twice as slow from the fifth
        t += dt
        s.completed(10, t)
        if k in (4, 5):  # the slow windows are not yet a plateau
            assert not s.reached
    assert s.reached
    r = s.result([], None)
    assert r.burst_tok_s == pytest.approx(100.0) and r.steady_tok_s == pytest.approx(50.0)
    assert r.time_to_steady_s == pytest.approx(0.4 + 0.6)  # the third slow window closes the plateau
    assert r.steady_req_s == pytest.approx(5.0)


def test_a_slope_within_the_tolerance_is_steady():
    s = SteadyStateCheck(window=1, tolerance=0.1, span=3, start=0.0)
    for t, tok in ((1.0, 100), (2.0, 98), (3.0, 96)):  # -2%/window: 4% across the span
        s.completed(tok, t)
    assert s.reached
    s2 = SteadyStateCheck(window=1, tolerance=0.1, span=3, start=0.0)
    for t, tok in ((1.0, 100), (2.0, 90), (3.0, 80)):  # 20% across the span
        s2.completed(tok, t)
    assert not s2.reached


def _workload(tmp_path, n=4):
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"word{i} please"],
                                     "reference": [f"word{i}"]}) + "\n" for i in range(n)))
    return str(p)


def _run(tmp_path, seconds, steady):
    cfg = parse_run_config({
        "configs": [{"name": "engine", "max_tokens": 8}],
        "workload": {"spec": _workload(tmp_path)},
        "load": {"concurrency": [1], "warmup": 0, "num_requests": 4, "steady_state": steady},
        "bootstrap": 0, "verify_curve": False, "calibration": False, "cpu_watts": 2.0,
    })
    calls: list[str] = []
    result = Runner(cfg, tmp_path / "run", show_progress=False,
                    backend_factory=lambda bc: SleepBackend(bc, calls, seconds)).run()
    return result, calls


def test_sustained_level_reports_the_throttled_steady_state(tmp_path):
    """The engine slows down request by request to half speed (a machine that heats up), then holds: the level
    goes on past its planned 4 requests until the slow throughput is steady, and reports it beside the burst."""
    ramp = 8  # requests; long service times, so a busy machine's jitter stays small beside the 12%/window ramp
    result, calls = _run(tmp_path, lambda n, bc: 0.08 * (1 + min(n, ramp) / ramp),
                         {"window": 2, "tolerance": 0.2, "span": 3, "duration_s": 60, "max_requests": 1000})
    ss = result.configs[0].loads[0].steady_state
    assert ss is not None and ss.reached
    assert len(calls) >= ramp + 2  # past the ramp
    assert ss.steady_tok_s == pytest.approx(ss.burst_tok_s * 0.53, rel=0.3)  # 8 tokens in 160 ms vs ~85 ms
    assert ss.time_to_steady_s is not None and ss.time_to_steady_s >= ramp * 0.08
    assert ss.samples and ss.samples[0].t >= 0  # the machine's conditions were read through the level
    assert ss.steady_j_per_request is not None and ss.steady_j_per_request >= 0  # the estimate, at steady state
    run = load_run(tmp_path / "run")
    assert run.configs[0].loads[0].steady_state == ss
    assert not any("not steady" in n for n in run.notes)
    text = steady_text(run).plain
    assert "burst" in text and "steady" in text and "J/request at steady state (estimated" in text
    page = _report(tmp_path / "run")
    assert 'id="chart-steady"' in page and 'id="steady-warning"' not in page
    energy = page[page.index('id="energy-table"'):]
    assert "engine" in energy and "estimated: CPU time x 2.00 W" in energy  # per accepted task, with its method


def test_a_level_that_never_settles_ends_at_its_duration_and_says_so(tmp_path):
    result, calls = _run(tmp_path, lambda n, bc: 0.005 * (n + 1),  # slower with every request
                         {"window": 2, "tolerance": 0.01, "span": 3, "duration_s": 0.6, "max_requests": 1000})
    ss = result.configs[0].loads[0].steady_state
    assert ss is not None and not ss.reached and ss.steady_tok_s is None and ss.duration_s == 0.6
    assert len(calls) < 1000
    run = load_run(tmp_path / "run")
    assert any("not steady" in n for n in run.notes) and "NOT STEADY" in steady_text(run).plain
    assert 'id="steady-warning"' in _report(tmp_path / "run")


def _report(run_dir) -> str:
    from specledger.ledger.price import price_run
    from specledger.report.html import render_report

    return render_report(price_run(run_dir, samples=200), run_dir)


@pytest.mark.parametrize("text,want", [("300", 300.0), ("45s", 45.0), ("5m", 300.0), ("1.5h", 5400.0)])
def test_parse_duration(text, want):
    assert parse_duration(text) == want


@pytest.mark.parametrize("bad", ["", "m", "five", "-3", "0", "inf"])
def test_parse_duration_refuses_nonsense(bad):
    with pytest.raises(BadInput, match="--sustain"):
        parse_duration(bad)


def test_conditions_read_here():
    s = read_conditions(0.0, [])
    assert s.t == 0.0 and (s.cpu_mhz is None or s.cpu_mhz > 0)


def _fake_sysfs(root, khz=(2_000_000, 3_000_000), millic=(45_000, 71_500)):
    for i, f in enumerate(khz):
        d = root / f"devices/system/cpu/cpu{i}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_cur_freq").write_text(f"{f}\n")
    (root / "devices/system/cpu/cpufreq").mkdir(parents=True)  # not a CPU: never read
    for i, m in enumerate(millic):
        d = root / f"class/hwmon/hwmon{i}"
        d.mkdir(parents=True)
        (d / f"temp{i + 1}_input").write_text(f"{m}\n")
        (d / "name").write_text("coretemp\n")
    return root


def test_the_sampler_reads_cpufreq_and_hwmon(tmp_path, monkeypatch):
    """cpufreq's kHz and hwmon's m°C, read through the level; sysfs wins over psutil's nominal clock."""
    from specledger.bench import steady

    monkeypatch.setattr(steady.psutil, "cpu_freq", lambda: pytest.fail("cpufreq was there"))
    monkeypatch.setattr(steady.psutil, "sensors_temperatures", lambda: {}, raising=False)
    with steady.ConditionSampler(every_s=0.01, sys_root=_fake_sysfs(tmp_path), gpus=[]) as sampler:
        while len(sampler.samples) < 3:
            time.sleep(0.01)
    s = sampler.samples[-1]
    assert s.cpu_mhz == pytest.approx(2500.0) and s.cpu_temp_c == pytest.approx(71.5)
    assert s.gpu_temp_c is None and s.gpu_sm_mhz is None and s.gpu_throttle is None
    assert [x.t for x in sampler.samples] == sorted(x.t for x in sampler.samples)


def test_absent_sources_stay_absent_and_psutil_fills_in(tmp_path, monkeypatch):
    from specledger.bench import steady

    monkeypatch.setattr(steady.psutil, "cpu_freq", lambda: None)
    monkeypatch.setattr(steady.psutil, "sensors_temperatures", lambda: {}, raising=False)
    s = read_conditions(0.0, [], tmp_path)  # a cloud VM: no cpufreq, no hwmon, no sensors
    assert s.cpu_mhz is None and s.cpu_temp_c is None
    shw = namedtuple("shw", "label current high critical")
    monkeypatch.setattr(steady.psutil, "cpu_freq", lambda: SimpleNamespace(current=1234.0))
    monkeypatch.setattr(steady.psutil, "sensors_temperatures",
                        lambda: {"acpitz": [shw("", 52.0, None, None)], "nvme": [shw("", 0.0, None, None)]})
    s = read_conditions(0.0, [], tmp_path)
    assert s.cpu_mhz == 1234.0 and s.cpu_temp_c == 52.0
    s = read_conditions(0.0, [], _fake_sysfs(tmp_path, khz=(), millic=(40_000,)))
    assert s.cpu_temp_c == 52.0  # the hottest of hwmon and psutil's sensors


def test_nvml_counters_are_read_one_by_one(monkeypatch):
    """A GPU without a temperature sensor still reports its clock and throttle reasons."""
    def no_sensor(h, kind):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    fake = SimpleNamespace(NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, nvmlDeviceGetTemperature=no_sensor,
                           nvmlDeviceGetClockInfo=lambda h, kind: 1410 if kind == 1 else 0,
                           nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = read_conditions(0.0, ["gpu0"])
    assert s.gpu_temp_c is None and s.gpu_sm_mhz == 1410.0 and s.gpu_throttle == 0x4


@pytest.mark.parametrize("exposed", [True, False])
def test_the_report_plots_the_conditions_or_says_they_are_not_exposed(tmp_path, monkeypatch, exposed):
    from specledger.bench import steady

    monkeypatch.setattr(steady, "cpu_mhz", lambda root: 2400.0 if exposed else None)
    monkeypatch.setattr(steady, "hottest_c", lambda root: 66.0 if exposed else None)
    _run(tmp_path, lambda n, bc: 0.01, {"window": 2, "tolerance": 0.5, "span": 2, "duration_s": 0.3,
                                        "max_requests": 1000})
    ss = load_run(tmp_path / "run").configs[0].loads[0].steady_state
    assert ss is not None and ss.samples
    page = _report(tmp_path / "run")
    chart = page[page.index('id="chart-steady"'):page.index('id="steady-table"')]
    assert ("MHz" in chart and "°C" in chart) == exposed
    assert ('id="conditions-unexposed"' in page) != exposed
    if not exposed:
        assert "CPU frequency, temperature: not exposed on this host." in page


def test_what_is_not_exposed_names_the_gpu_only_on_a_gpu_run():
    from specledger.records.results import ConditionSample, SteadyState
    from specledger.report.html import unexposed

    ss = SteadyState(window=1, tolerance=0.1, reached=False, windows_tok_s=[1.0],
                     samples=[ConditionSample(t=0.0, cpu_mhz=2000.0)])
    assert unexposed([ss], gpu=False) == ["temperature"]
    assert unexposed([ss], gpu=True) == ["temperature", "GPU clocks", "GPU throttle reasons"]
    ss.samples.append(ConditionSample(t=1.0, gpu_temp_c=60.0, gpu_sm_mhz=1400.0, gpu_throttle=0))  # 0: none
    assert unexposed([ss], gpu=True) == []


def test_steady_joules_per_request_are_the_steady_windows_joules_over_their_requests():
    """Windows of 4 requests, each request 2.5 J: the steady figure is 2.5 J a request (not divided again by the
    window's size or its seconds)."""
    s = SteadyStateCheck(window=4, tolerance=0.05, span=2, start=0.0, energy_start=100.0)
    t, joules = 0.0, 100.0
    for _ in range(12):
        t, joules = t + 0.5, joules + 2.5
        s.completed(10, t, joules)
    r = s.result([], None)
    assert r.reached and s.windows_j == [10.0, 10.0, 10.0]
    assert r.steady_j_per_request == pytest.approx(2.5)

"""Energy: counters (RAPL) with idle power subtracted, and the CPU-time estimate where no counter exists."""

import time

import pytest

from specledger.bench import energy
from specledger.bench.energy import EnergyMeter, watts_per_cpu


def _rapl(root, zone, energy_uj, max_range):
    d = root / zone
    d.mkdir(parents=True, exist_ok=True)
    (d / "energy_uj").write_text(str(energy_uj))
    (d / "max_energy_range_uj").write_text(str(max_range))


def test_rapl_meter_handles_wrap_and_skips_subzones(tmp_path):
    _rapl(tmp_path, "intel-rapl:0", 900_000, 1_000_000)
    _rapl(tmp_path, "intel-rapl:0:0", 5, 1_000_000)  # a subzone inside package 0: not double counted
    m = EnergyMeter(powercap_root=str(tmp_path), use_nvml=False, idle_probe_s=0)
    assert m.available and m.source == "rapl"
    assert m.read() == 0.0
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("950000")
    assert m.read() == pytest.approx(0.05)
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("50000")  # wrapped past 1_000_000
    assert m.read() == pytest.approx(0.05 + 0.100001)


def test_rapl_idle_power_is_measured_first_and_subtracted(tmp_path, monkeypatch):
    """The package draws 10 W while nothing runs: a run that adds 5 J in 1 s reads 5 J, not 15 J."""
    _rapl(tmp_path, "intel-rapl:0", 0, 10**12)
    clock = [100.0]
    monkeypatch.setattr(energy.time, "perf_counter", lambda: clock[0])

    def idle_sleep(s):  # the probe's wait: 10 W for s seconds
        clock[0] += s
        f = tmp_path / "intel-rapl:0" / "energy_uj"
        f.write_text(str(int(f.read_text()) + int(10 * s * 1e6)))

    monkeypatch.setattr(energy.time, "sleep", idle_sleep)
    m = EnergyMeter(powercap_root=str(tmp_path), use_nvml=False, idle_probe_s=0.5)
    assert m.idle_watts == pytest.approx(10.0) and "idle 10.0 W subtracted" in m.source
    idle_sleep(1.0)  # one second of the run: 10 J idle ...
    f = tmp_path / "intel-rapl:0" / "energy_uj"
    f.write_text(str(int(f.read_text()) + 5_000_000))  # ... and 5 J of work
    assert m.read() == pytest.approx(5.0)


def test_meter_unavailable_reads_none(tmp_path):
    m = EnergyMeter(powercap_root=str(tmp_path / "none"), use_nvml=False, estimate=False)
    assert not m.available and m.source == "unavailable" and m.read() is None


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


def test_estimate_is_cpu_time_times_the_given_power(tmp_path):
    m = EnergyMeter(powercap_root=str(tmp_path / "none"), use_nvml=False, cpu_watts=3.0)
    assert m.available and m.method == "estimated" and m.source.startswith("estimated: CPU time x 3.00 W")
    t0 = time.process_time()
    _burn(0.3)
    spent = time.process_time() - t0
    j = m.read()
    assert j is not None and j == pytest.approx(3.0 * spent, rel=0.2, abs=0.15)  # idle waits cost nothing
    time.sleep(0.2)
    assert m.read() == pytest.approx(j, abs=0.1)


def test_estimate_counts_a_live_child_process(tmp_path):
    """A managed server is a child process that runs through the whole run: its CPU time is the run's too."""
    import subprocess
    import sys

    m = EnergyMeter(powercap_root=str(tmp_path / "none"), use_nvml=False, cpu_watts=1.0)
    code = "import sys,time\nt=time.process_time()\nwhile time.process_time()-t<0.4: pass\nprint('done',flush=True)\n" \
           "sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"  # burnt, still alive
        j = m.read()
        assert j is not None and j >= 0.35
    finally:
        child.kill()
        child.wait()


def test_known_cpus_table():
    w, basis = watts_per_cpu("AMD EPYC 7763 64-Core Processor")
    assert w == pytest.approx(280 / 128) and "280 W" in basis
    assert watts_per_cpu("AMD EPYC")[0] == pytest.approx(280 / 128)  # a VM that shows the family only
    w, basis = watts_per_cpu("Some Future CPU")
    assert w == energy.DEFAULT_WATTS_PER_CPU and basis.startswith("unknown")


def test_nvml_counter_is_read_in_millijoules(tmp_path, monkeypatch):
    """NVML's total-energy counter counts millijoules: two GPUs that drew 250 J and 40 J read 290 J (not 0.29 J),
    read through a fake pynvml so the unit is tested on hosts without a GPU."""
    import sys
    from types import SimpleNamespace

    counters = {0: 5_000_000, 1: 123}  # mJ since the driver loaded
    fake = SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
                           nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetTotalEnergyConsumption=lambda h: counters[h])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = EnergyMeter(powercap_root=str(tmp_path / "none"), idle_probe_s=0)
    assert m.method == "nvml" and m.source == "nvml" and m.read() == 0.0
    counters[0] += 250_000
    counters[1] += 40_000
    assert m.read() == pytest.approx(290.0)

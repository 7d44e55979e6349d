"""Energy: counters where the machine has them (Linux powercap RAPL, NVML), an estimate where it has none.

Every figure carries its method (`EnergyMeter.source`): "rapl", "nvml", "rapl+nvml", or "estimated: …" — the
process tree's CPU seconds times a power per busy logical CPU (`cpu_watts`, else a table of known CPUs). Counters
measure the whole package, so the idle power read before the run is subtracted from them; the estimate counts
busy CPU time only, so idle is left out by construction. Each method has a stated relative spread
(`METHOD_SPREAD`) that the ledger carries into its Monte Carlo.

Why not CodeCarbon: without RAPL it falls back to a constant share of the CPU's TDP whatever the load, it pulls
pandas and a geolocation lookup over the network, and it meters time windows of the whole machine rather than one
request; what it knows that matters here (a TDP per CPU model, a per-thread share) is the few lines below.
"""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import dataclass, field

import psutil


# (pattern on /proc/cpuinfo's model name, what it stands for, package TDP in watts, logical CPUs per package). Cloud
# VMs often show only the family ("AMD EPYC"), so family rows come last as the fallback for their models.
KNOWN_CPUS: list[tuple[str, str, float, int]] = [
    (r"EPYC 9[0-9]{3}", "AMD EPYC Genoa, e.g. 9654", 360.0, 192),
    (r"EPYC 7[0-9]{2}3", "AMD EPYC Milan, e.g. 7763", 280.0, 128),
    (r"EPYC 7[0-9]{2}2", "AMD EPYC Rome", 225.0, 128),
    (r"AMD EPYC", "AMD EPYC, model not shown", 280.0, 128),
    (r"Xeon.*Platinum 84[0-9]{2}", "Xeon Sapphire Rapids, e.g. 8480+", 350.0, 112),
    (r"Xeon.*Platinum 83[0-9]{2}", "Xeon Ice Lake, e.g. 8380", 270.0, 80),
    (r"Xeon", "Xeon, model not known", 250.0, 80),
    (r"Ryzen", "AMD Ryzen", 105.0, 16),
    (r"Core\(TM\) i[3579]", "Intel Core", 65.0, 12),
]
DEFAULT_WATTS_PER_CPU = 4.0  # an unknown server CPU: ~250 W over ~64 threads


def watts_per_cpu(model: str | None) -> tuple[float, str]:
    """Power of one busy logical CPU for a CPU model name, and where the figure comes from."""
    for pattern, label, tdp, threads in KNOWN_CPUS:
        if model and re.search(pattern, model):
            return tdp / threads, f"{tdp:.0f} W TDP / {threads} threads: {label}"
    return DEFAULT_WATTS_PER_CPU, "unknown CPU: a default"


@dataclass
class _RaplZone:
    path: str
    max_uj: int
    last_uj: int
    total_uj: int = 0


def tree_cpu_seconds(proc: psutil.Process) -> float:
    """CPU seconds of this process, its reaped children and its live ones (a managed server)."""
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:  # exited meanwhile: counted in children_* once reaped
            continue
        total += c.user + c.system
    return total


def nvml_handles() -> list:
    """The GPUs NVML sees (pynvml is optional: none without the library or a driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no library, no driver
        return []


@dataclass
class EnergyMeter:
    """Cumulative joules since creation across every readable source, or estimated from CPU time.

    RAPL counters wrap at max_energy_range_uj; a reading lower than the last one means one wrap
    (read() is called at least at every request boundary, far more often than a wrap occurs).
    `estimate`: fall back to CPU time x power where no counter exists (False where the work runs in processes
    this one cannot see, e.g. a remote server: there energy is unavailable rather than wrong).
    """

    powercap_root: str = "/sys/class/powercap"
    use_nvml: bool = True
    estimate: bool = True
    cpu_watts: float | None = None  # power of one busy logical CPU for the estimate; None: KNOWN_CPUS
    cpu_model: str | None = None  # for the table; None: read from /proc/cpuinfo
    idle_probe_s: float = 0.5  # how long the counters are read with nothing running, to subtract idle power
    idle_watts: float = 0.0
    _zones: list[_RaplZone] = field(default_factory=list)
    _nvml: list = field(default_factory=list)
    _nvml_start: list[int] = field(default_factory=list)
    _watts: float = 0.0
    _basis: str = ""
    _cpu0: float = 0.0
    _j0: float = 0.0
    _t0: float = 0.0

    def __post_init__(self) -> None:
        # top-level packages only (intel-rapl:0, not the subzones intel-rapl:0:0 they contain)
        for zone in sorted(glob.glob(os.path.join(self.powercap_root, "intel-rapl:*"))):
            if os.path.basename(zone).count(":") != 1:
                continue
            try:
                now = _read_int(os.path.join(zone, "energy_uj"))
                max_uj = _read_int(os.path.join(zone, "max_energy_range_uj"))
            except (OSError, ValueError):
                continue
            self._zones.append(_RaplZone(zone, max_uj, now))
        if self.use_nvml and (gpus := nvml_handles()):
            try:
                import pynvml

                self._nvml_start = [int(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in gpus]
                self._nvml = gpus
            except Exception:  # no energy counter on this GPU
                self._nvml, self._nvml_start = [], []
        if self._zones or self._nvml:
            if self.idle_probe_s > 0:  # the counters' idle power, before anything of the run runs
                j0, t0 = self._counters(), time.perf_counter()
                time.sleep(self.idle_probe_s)
                self.idle_watts = max(0.0, (self._counters() - j0) / (time.perf_counter() - t0))
            self._j0, self._t0 = self._counters(), time.perf_counter()
        elif self.estimate:
            if self.cpu_watts is not None:
                self._watts, self._basis = self.cpu_watts, "given"
            else:
                from specledger.bench.env import cpu_model

                self._watts, self._basis = watts_per_cpu(self.cpu_model or cpu_model())
            self._proc = psutil.Process()
            self._cpu0 = tree_cpu_seconds(self._proc)

    @property
    def method(self) -> str:
        """The method's key in METHOD_SPREAD."""
        parts = (["rapl"] if self._zones else []) + (["nvml"] if self._nvml else [])
        return "+".join(parts) or ("estimated" if self._watts else "unavailable")

    @property
    def source(self) -> str:
        """The method as the run records and shows it."""
        m = self.method
        if m == "estimated":
            return f"estimated: CPU time x {self._watts:.2f} W per busy CPU ({self._basis})"
        if m != "unavailable" and self.idle_watts:
            return f"{m} (idle {self.idle_watts:.1f} W subtracted)"
        return m

    @property
    def available(self) -> bool:
        return self.method != "unavailable"

    def _counters(self) -> float:
        total_uj = 0
        for z in self._zones:
            try:
                now = _read_int(os.path.join(z.path, "energy_uj"))
            except (OSError, ValueError):
                continue
            z.total_uj += now - z.last_uj + (z.max_uj + 1 if now < z.last_uj else 0)  # below the last: one wrap
            z.last_uj = now
            total_uj += z.total_uj
        joules = total_uj / 1e6
        if self._nvml:
            import pynvml

            for h, start in zip(self._nvml, self._nvml_start):
                joules += (int(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)) - start) / 1e3  # mJ
        return joules

    def read(self) -> float | None:
        """Joules consumed since the meter was created (above idle); None when nothing can be measured or estimated."""
        if self._zones or self._nvml:
            idle = self.idle_watts * (time.perf_counter() - self._t0)
            return self._counters() - self._j0 - idle
        if self._watts:
            return (tree_cpu_seconds(self._proc) - self._cpu0) * self._watts
        return None


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())

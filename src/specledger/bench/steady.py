"""Steady state: is a load level's throughput still moving, and what did the machine do meanwhile?

A burst of a few minutes on a cool machine is not what a deployment gets (users report 5-18% drift from a burst
to sustained load), so a level can be held (`--sustain DURATION`, load.steady_state) until its throughput stops
moving: consecutive windows of `window` completed conversations, each with its tokens/s, requests/s and joules;
steady when the least-squares slope over the last `span` windows moves throughput by at most `tolerance` of
their mean across those windows. The steady figures are the mean of those windows; the burst is the first.
Alongside, `ConditionSampler` reads the CPU frequency and temperatures (and, on NVIDIA GPUs, their temperature,
SM clock and throttle reasons) once a second, so a throttling machine shows why it slowed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from specledger.bench.energy import nvml_handles
from specledger.records.results import ConditionSample, SteadyState

SYS = Path("/sys")


def parse_duration(text: str) -> float:
    """'300', '300s', '5m', '1.5h' -> seconds (a BadInput naming the option otherwise)."""
    from specledger.errors import BadInput

    t = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    try:
        v = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        v = -1.0
    if not v > 0 or v == float("inf"):
        raise BadInput(f"--sustain: expected a duration such as 300, 300s, 5m or 1h, got {text!r}")
    return v


def sustain_settings(duration: str | None) -> dict | None:
    """The load.steady_state settings `--sustain DURATION` stands for (None: not given)."""
    return None if duration is None else {"duration_s": parse_duration(duration), "max_requests": 1_000_000}


@dataclass
class SteadyStateCheck:
    window: int
    tolerance: float
    span: int = 2
    start: float = field(default_factory=time.perf_counter)
    windows: list[float] = field(default_factory=list)  # tokens/s
    windows_req_s: list[float] = field(default_factory=list)
    windows_j: list[float | None] = field(default_factory=list)  # joules in each window (None: not measured)
    ends: list[float] = field(default_factory=list)  # each window's end, seconds from the level's start
    reached_at: float | None = None  # seconds from the start when the check began to hold, this time
    energy_start: float | None = None  # the energy meter at the start (then at each window's end)
    _tokens: int = 0
    _count: int = 0
    _window_start: float = 0.0

    def __post_init__(self) -> None:
        self._window_start = self.start

    def completed(self, tokens: int, t: float, energy_j: float | None = None) -> None:
        """One conversation finished at perf_counter t with `tokens` output tokens; energy_j: the meter now."""
        self._tokens += tokens
        self._count += 1
        if self._count == self.window:
            span = max(t - self._window_start, 1e-9)
            self.windows.append(self._tokens / span)
            self.windows_req_s.append(self._count / span)
            e0 = self.energy_start
            self.windows_j.append(None if e0 is None or energy_j is None else energy_j - e0)
            self.ends.append(t - self.start)
            self._tokens, self._count, self._window_start, self.energy_start = 0, 0, t, energy_j
            if not self.reached:  # the steady stretch (if any) starts again
                self.reached_at = None
            elif self.reached_at is None:
                self.reached_at = t - self.start

    @property
    def reached(self) -> bool:
        n = max(2, self.span)
        if len(self.windows) < n:
            return False
        ys, xs = self.windows[-n:], self.ends[-n:]
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
        return abs(slope * (xs[-1] - xs[0])) <= self.tolerance * max(my, 1e-12)

    def result(self, samples: list[ConditionSample], duration_s: float | None) -> SteadyState:
        n = max(2, self.span)
        steady = self.reached
        last = slice(-n, None)
        joules = self.windows_j[last]
        return SteadyState(
            window=self.window, tolerance=self.tolerance, span=n, reached=steady, windows_tok_s=self.windows,
            windows_req_s=self.windows_req_s, window_ends_s=self.ends, duration_s=duration_s,
            burst_tok_s=self.windows[0] if self.windows else None,
            steady_tok_s=sum(self.windows[last]) / n if steady else None,
            steady_req_s=sum(self.windows_req_s[last]) / n if steady else None,
            time_to_steady_s=self.reached_at if steady else None,
            steady_j_per_request=(sum(j for j in joules if j is not None) / (n * self.window)
                                  if steady and all(j is not None for j in joules) else None),
            samples=samples)


def _numbers(paths: list[Path], scale: float) -> list[float]:
    """The positive integers in these sysfs files, times scale (an unreadable or empty file is skipped)."""
    out = []
    for f in paths:
        try:
            v = int(f.read_text().strip()) * scale
        except (OSError, ValueError):
            continue
        if v > 0:
            out.append(v)
    return out


def cpu_mhz(sys_root: Path) -> float | None:
    """The mean of the CPUs' current clocks (cpufreq's scaling_cur_freq, kHz); psutil's reading where cpufreq is
    not exposed (it falls back on /proc/cpuinfo, a VM's nominal clock); None where neither has one."""
    mhz = _numbers(sorted(sys_root.glob("devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")), 1e-3)
    if mhz:
        return sum(mhz) / len(mhz)
    try:
        freq = psutil.cpu_freq()
    except Exception:  # psutil without it on this platform, or a read that failed
        return None
    return float(freq.current) if freq is not None and freq.current else None


def hottest_c(sys_root: Path) -> float | None:
    """The hottest temperature the host exposes: hwmon's temp*_input (m°C) and psutil's sensors (the same
    hwmon on Linux; other sources elsewhere); None where there is none (most cloud VMs)."""
    temps = _numbers(sorted(sys_root.glob("class/hwmon/hwmon*/temp*_input")), 1e-3)
    try:
        sensors = psutil.sensors_temperatures() if hasattr(psutil, "sensors_temperatures") else {}
    except Exception:
        sensors = {}
    temps += [s.current for entries in sensors.values() for s in entries if s.current and s.current > 0]
    return max(temps, default=None)


def read_conditions(t: float, gpus: list, sys_root: Path = SYS) -> ConditionSample:
    """One reading of what moves throughput besides the engine: CPU clock and heat, GPU heat/clock/throttling.
    Each source is optional: one this host does not expose stays None."""
    s = ConditionSample(t=t, cpu_mhz=cpu_mhz(sys_root), cpu_temp_c=hottest_c(sys_root))
    if gpus:
        import pynvml

        h = gpus[0]
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons  # renamed in recent drivers' bindings
        reads = {"gpu_temp_c": lambda: float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                 "gpu_sm_mhz": lambda: float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                 "gpu_throttle": lambda: int(reasons(h))}
        for name, read in reads.items():
            try:
                setattr(s, name, read())
            except Exception:  # a counter this GPU does not have: the others still count
                pass
    return s


class ConditionSampler:
    """Reads the machine's conditions every `every_s` seconds on a daemon thread (no torch: it never competes
    with the torch thread for an OpenMP team) until stop(). t0: the perf_counter the samples' times count from
    (the level's start, so they share the throughput windows' time axis); sys_root: where sysfs is."""

    def __init__(self, every_s: float = 1.0, *, t0: float | None = None, sys_root: Path = SYS,
                 gpus: list | None = None) -> None:
        self.every_s = every_s
        self.samples: list[ConditionSample] = []
        self._stop = threading.Event()
        self._t0 = time.perf_counter() if t0 is None else t0
        self._sys_root = sys_root
        self._gpus = nvml_handles() if gpus is None else gpus
        self._thread = threading.Thread(target=self._run, name="specledger-conditions", daemon=True)

    def __enter__(self) -> "ConditionSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self.samples.append(read_conditions(time.perf_counter() - self._t0, self._gpus, self._sys_root))
            if self._stop.wait(self.every_s):
                return

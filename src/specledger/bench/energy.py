"""Energy counters: Linux powercap (RAPL) and NVML. Unavailable means null, never an estimate."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field


@dataclass
class _RaplZone:
    path: str
    max_uj: int
    last_uj: int
    total_uj: int = 0


@dataclass
class EnergyMeter:
    """Cumulative joules since creation across every readable source.

    RAPL counters wrap at max_energy_range_uj; a reading lower than the last one means one wrap
    (read() is called at least at every request boundary, far more often than a wrap occurs).
    """

    powercap_root: str = "/sys/class/powercap"
    use_nvml: bool = True
    _zones: list[_RaplZone] = field(default_factory=list)
    _nvml: list = field(default_factory=list)
    _nvml_start: list[int] = field(default_factory=list)

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
        if self.use_nvml:
            try:
                import pynvml  # optional

                pynvml.nvmlInit()
                for i in range(pynvml.nvmlDeviceGetCount()):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    self._nvml_start.append(int(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)))
                    self._nvml.append(h)
            except Exception:  # no library, no driver, or no energy counter on this GPU
                self._nvml, self._nvml_start = [], []

    @property
    def source(self) -> str:
        parts = (["rapl"] if self._zones else []) + (["nvml"] if self._nvml else [])
        return "+".join(parts) or "unavailable"

    @property
    def available(self) -> bool:
        return bool(self._zones or self._nvml)

    def read(self) -> float | None:
        """Joules consumed since the meter was created; None when no counter is readable."""
        if not self.available:
            return None
        total_uj = 0
        for z in self._zones:
            try:
                now = _read_int(os.path.join(z.path, "energy_uj"))
            except (OSError, ValueError):
                continue
            delta = now - z.last_uj
            if delta < 0:
                delta += z.max_uj + 1
            z.total_uj += delta
            z.last_uj = now
            total_uj += z.total_uj
        joules = total_uj / 1e6
        if self._nvml:
            import pynvml

            for h, start in zip(self._nvml, self._nvml_start):
                joules += (int(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)) - start) / 1e3  # mJ
        return joules


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())

"""Noise awareness: a fixed, short matrix product timed before, during and after a run.

The probe does the same work every time, so a change in its time is a change in the machine
(another process taking a core, frequency scaling, thermal limits), not in the code measured.
The run records each probe with the load average, and the thread settings; the report warns,
naming the cause, when the probe drifts more than DRIFT_WARN or the load exceeds the cores.
"""

from __future__ import annotations

import os
import time
from typing import Any

from specledger.bench.results import Noise, NoiseProbe

DRIFT_WARN = 0.10  # probes 10% apart: speed-ups of that size between configurations are suspect
PROBE_SIZE = 256  # fp32 matrix side: ~0.3-1 ms per product on one CPU core
PROBE_REPEATS = 21


def probe_ms(size: int = PROBE_SIZE, repeats: int = PROBE_REPEATS) -> float:
    """Median time (ms) of one fixed fp32 matrix product on one thread: the speed of a core. (With several
    threads a product this small mostly times the thread pool's wake-ups, which on some machines are a
    constant scheduler quantum, not work; the load average and thread settings cover contention.)"""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g)
    b = torch.randn(size, size, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(repeats + 2):
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    times = sorted(times[2:])  # the first products warm the caches
    return 1000.0 * times[len(times) // 2]


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def thread_settings() -> dict[str, Any]:
    """What decides how many cores the engine uses."""
    out: dict[str, Any] = {"cpu_count": os.cpu_count()}
    try:
        out["affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        import torch

        from specledger.engine import threads

        out["torch_threads"] = threads.count()
        out["torch_interop_threads"] = torch.get_num_interop_threads()
    except ImportError:
        pass
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if os.environ.get(var):
            out[var] = os.environ[var]
    return out


def take_probe(when: str, probe=probe_ms) -> NoiseProbe:
    return NoiseProbe(when=when, ms=probe(), load_avg=load_average())


def assess(noise: Noise, *, threshold: float = DRIFT_WARN) -> Noise:
    """Drift of the probes and, past the threshold or with more runnable processes than cores, a warning
    that names the likely cause."""
    ms = [p.ms for p in noise.probes if p.ms > 0]
    noise.drift = (max(ms) - min(ms)) / min(ms) if len(ms) >= 2 else None
    cores = noise.threads.get("affinity") or noise.threads.get("cpu_count") or 1
    loads = [p.load_avg[0] for p in noise.probes if p.load_avg]
    busy = max(loads, default=0.0)
    causes = []
    if noise.drift is not None and noise.drift > threshold:
        slow = max(noise.probes, key=lambda p: p.ms)
        causes.append(f"the calibration probe drifted {noise.drift:.0%} (slowest {slow.when} the run)")
    if busy > cores:
        causes.append(f"load average {busy:.1f} on {cores} core{'s' if cores != 1 else ''}: "
                      "other processes competed for the CPU")
    threads = noise.threads.get("torch_threads")
    if threads and threads > cores:
        causes.append(f"torch uses {threads} threads on {cores} cores (oversubscribed)")
    noise.warning = ("; ".join(causes) + ". Differences of that order between configurations may be noise "
                     "(interleaving spreads it over all of them)") if causes else None
    return noise

"""Noise awareness: a fixed, short matrix product timed before, during and after a run.

The probe does the same work every time, so a change in its time is a change in the machine
(another process taking a core, frequency scaling, thermal limits), not in the code measured.
The run records each probe with the load average, the CPU counters and the thread settings; the report warns,
naming the cause, when the probe drifts more than DRIFT_WARN or other processes took the CPU: the machine's busy
CPU time minus this run's own (its threads and child processes) between two probes. (The load average alone
counts the run's own threads, so a run with nothing beside it could look "noisy"; it decides only where the
counters are missing.) The probe is warmed before it is timed: the first one after loading gigabytes of weights ran
31% slower than the rest on a quiet machine (a cold core and caches), which read as noise ("slowest before the run").
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

from specledger.records.results import Noise, NoiseProbe

DRIFT_WARN = 0.10  # probes 10% apart: speed-ups of that size between configurations are suspect
OTHERS_WARN = 0.25  # other processes busy on a quarter of the cores (at least half a core) on average: contention
PROBE_SIZE = 256  # fp32 matrix side: ~0.3-1 ms per product on one CPU core
PROBE_REPEATS = 21
WARM_S = 1.0  # seconds of products before any is timed
WARM_TOL = 0.03  # then rounds until two in a row agree this closely ...
WARM_ROUNDS = 10  # ... or this many rounds
# The untimed warm-up is paid once per process: the cold probe is the first after loading weights; later probes
# (after a run, a resumed run in the same process) still time rounds until two agree.
_WARMED: list[bool] = []


def probe_ms(size: int = PROBE_SIZE, repeats: int = PROBE_REPEATS) -> tuple[float, float]:
    """Median time (ms) of one fixed fp32 matrix product on one thread once warm (settled_ms), and the first
    timed round's: the speed of a core. (With several threads a product this small mostly times the thread
    pool's wake-ups, which on some machines are a constant scheduler quantum, not work; the load average and
    thread settings cover contention.)"""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g)
    b = torch.randn(size, size, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return settled_ms(lambda: torch.mm(a, b), repeats, warm_s=0.0 if _WARMED else WARM_S)
    finally:
        _WARMED.append(True)
        torch.set_num_threads(threads)


def settled_ms(product: Callable[[], object], repeats: int = PROBE_REPEATS, warm_s: float = WARM_S) -> tuple[float, float]:
    """The product run untimed for warm_s seconds, then timed in rounds of `repeats` until two rounds' medians agree
    within WARM_TOL (at most WARM_ROUNDS): (the last round's median, the first's), in ms."""
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        product()
    medians: list[float] = []
    for _ in range(WARM_ROUNDS):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            product()
            times.append(time.perf_counter() - t0)
        medians.append(1000.0 * statistics.median(times))
        if len(medians) >= 2 and abs(medians[-1] - medians[-2]) <= WARM_TOL * min(medians[-2:]):
            break
    return medians[-1], medians[0]


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


def cpu_counters() -> tuple[float, float, float] | None:
    """(a clock every process shares, the machine's busy CPU seconds, this process tree's CPU seconds), or None
    where psutil cannot read them."""
    try:
        import psutil

        from specledger.bench.energy import tree_cpu_seconds

        t = psutil.cpu_times()
        # guest time is already in user time; steal is a neighbour taking the CPU: counted as others' work
        busy = sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
        return time.monotonic(), busy, tree_cpu_seconds(psutil.Process())
    except (ImportError, OSError, AttributeError, RuntimeError):
        return None


def take_probe(when: str) -> NoiseProbe:
    counters = cpu_counters()
    clock, busy, own = counters if counters is not None else (None, None, None)
    ms, first = probe_ms()
    return NoiseProbe(when=when, ms=ms, first_round_ms=first, load_avg=load_average(), clock_s=clock, busy_cpu_s=busy,
                      own_cpu_s=own)


def _counters(p: NoiseProbe) -> tuple[float, float, float] | None:
    if p.clock_s is None or p.busy_cpu_s is None or p.own_cpu_s is None:
        return None
    return p.clock_s, p.busy_cpu_s, p.own_cpu_s


def _others(noise: Noise) -> list[tuple[str, float]]:
    """Per interval between two probes with counters: (its name, other processes' mean CPU use in cores)."""
    out = []
    read = [(p, c) for p in noise.probes if (c := _counters(p)) is not None]
    for (a, (t0, busy0, own0)), (b, (t1, busy1, own1)) in zip(read, read[1:]):
        if t1 <= t0 or own1 < own0:  # another process resumed the run: its counters started afresh
            continue
        b.others_cores = max(0.0, (busy1 - busy0 - (own1 - own0)) / (t1 - t0))
        out.append((f"between the {a.when} and {b.when} probes", b.others_cores))
    return out


def assess(noise: Noise) -> Noise:
    """Drift of the probes and, past the threshold or with more runnable processes than cores, a warning
    that names the likely cause."""
    ms = [p.ms for p in noise.probes if p.ms > 0]
    noise.drift = (max(ms) - min(ms)) / min(ms) if len(ms) >= 2 else None
    cores = noise.threads.get("affinity") or noise.threads.get("cpu_count") or 1
    loads = [p.load_avg[0] for p in noise.probes if p.load_avg]
    busy = max(loads, default=0.0)
    causes = []
    if noise.drift is not None and noise.drift > DRIFT_WARN:
        slow = max(noise.probes, key=lambda p: p.ms)
        seen = ", ".join(f"{p.when} {p.ms:.2f} ms" for p in noise.probes if p.ms > 0)
        causes.append(f"the calibration probe drifted {noise.drift:.0%} ({seen}; slowest {slow.when} the run)")
    others = _others(noise)
    plural = "s" if cores != 1 else ""
    if others:
        when, most = max(others, key=lambda o: o[1])
        if most >= max(0.5, OTHERS_WARN * cores):
            causes.append(f"other processes kept {most:.1f} of {cores} core{plural} busy on average {when}: "
                          "they competed for the CPU")
    elif busy > cores:
        causes.append(f"load average {busy:.1f} on {cores} core{plural} (this run's own threads included): "
                      "other processes may have competed for the CPU")
    threads = noise.threads.get("torch_threads")
    if threads and threads > cores:
        causes.append(f"torch uses {threads} threads on {cores} cores (oversubscribed)")
    noise.warning = ("; ".join(causes) + ". Differences of that order between configurations may be noise "
                     "(interleaving spreads it over all of them)") if causes else None
    return noise

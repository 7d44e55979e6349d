"""torch's thread count for in-process runs, chosen by a quick probe unless the user gives it.

More threads are not always faster: on small shared VMs (two vCPUs that are hyper-threads of one core, or a
neighbour on the other core) one thread has been faster than two for every contender, while on a quiet
many-core host the products of a large model scale. So a run times what it is about to measure — a one-token
decode step and an 8-token verification pass of each in-process target on a short cached context — at each
candidate count, rounds alternating the counts so drift hits all of them, and keeps the fastest (the fewest
threads within TIE of it: fewer threads leave the machine's other work alone). The choice and the figures are
recorded with the run.

The probe, like every op of a run, runs on the process's torch thread (engine/threads.py), and the choice is that
thread's count: a probe in the main thread would leave the main thread a team of OpenMP workers of its own, which
halves the speed of every later pass on 2 cores.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from specledger.records.results import ThreadChoice, ThreadProbe

TIE = 0.03  # within 3% of the fastest: take the fewer threads
DROP = 1.5  # a count this many times slower than one thread after a round is not timed again
SIZES = (1, 8)  # new tokens per timed forward: a decode step, a verification pass (or 8 batched rows)
CONTEXT = 64
ROUNDS = 3


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def candidates(n_cores: int) -> list[int]:
    """1, the powers of two below the core count, and the core count."""
    out = {1, n_cores}
    k = 2
    while k < n_cores:
        out.add(k)
        k *= 2
    return sorted(out)


def time_forwards(models: dict[str, Any], counts: list[int]) -> list[ThreadProbe]:
    """Median seconds of each model's forward of n new tokens (SIZES) on CONTEXT cached ones, at each thread count.
    Each round visits every count (in a rotated order); after a switch one forward is left untimed (the pool
    spins up). A count already DROP times slower than one thread after the first round is not timed again
    (on a loaded machine extra threads can be many times slower, and the probe should stay short)."""
    import torch

    before = torch.get_num_threads()
    times: dict[tuple[str, int, int], list[float]] = {}
    try:
        with torch.inference_mode():
            for label, lm in models.items():
                m = lm.model
                dev = m.device
                gen = torch.Generator().manual_seed(0)
                cache = m.new_cache(CONTEXT + max(SIZES))
                m.hidden(torch.randint(0, m.cfg.vocab_size, (1, CONTEXT), generator=gen).to(dev), cache)
                xs = {n: torch.randint(0, m.cfg.vocab_size, (1, n), generator=gen).to(dev) for n in SIZES}
                live = list(counts)
                for r in range(ROUNDS):
                    for t in live[r % len(live):] + live[:r % len(live)]:
                        torch.set_num_threads(t)
                        _forward(m, cache, xs[SIZES[0]], CONTEXT)  # untimed: the pool spins up after a switch
                        for n in SIZES:
                            times.setdefault((label, n, t), []).append(_forward(m, cache, xs[n], CONTEXT))
                    if r == 0:  # counts already far slower than one thread: not timed again
                        one = {n: times[(label, n, counts[0])][0] for n in SIZES}
                        live = [t for t in live if t == counts[0]
                                or min(times[(label, n, t)][0] / one[n] for n in SIZES) < DROP]
    finally:
        torch.set_num_threads(before)
    return [ThreadProbe(model=label, tokens=n, threads=t, ms=round(1000 * statistics.median(v), 3))
            for (label, n, t), v in times.items()]


def _forward(m: Any, cache: Any, x: Any, context: int) -> float:
    """Seconds of one forward of x's tokens after `context` cached ones (logits at every new position)."""
    from specledger.engine.timing import clock

    cache.rollback(0, context)
    t0 = clock(m.device)
    m.logits(m.hidden(x, cache))
    return clock(m.device) - t0


def pick(probes: list[ThreadProbe], counts: list[int]) -> tuple[int, dict[int, float]]:
    """The count with the least time relative to one thread (geometric mean over models and sizes), the
    fewest threads within TIE of the best; and each count's score."""
    base = {(p.model, p.tokens): p.ms for p in probes if p.threads == counts[0]}
    score: dict[int, float] = {}
    for t in counts:
        ratios = [p.ms / base[(p.model, p.tokens)] for p in probes
                  if p.threads == t and base.get((p.model, p.tokens))]
        if ratios:
            score[t] = statistics.geometric_mean(ratios)
    if not score:
        return counts[0], score
    best = min(score.values())
    return min(t for t, s in score.items() if s <= best * (1 + TIE)), score


def choose_threads(models: dict[str, Any], *, given: int | None = None, counts: list[int] | None = None
                   ) -> ThreadChoice:
    """Set torch's thread count: `given` as is, else by the probe over `models` (label -> LoadedModel); with
    no model to time (an HTTP-only run) the count is left alone."""
    from specledger.engine import threads

    if given is not None:
        threads.set_count(given)
        return ThreadChoice(threads=given, source="given")
    counts = counts or candidates(cores())
    if not models or len(counts) < 2:
        why = "no in-process model to time" if not models else "one core"
        return ThreadChoice(threads=threads.count(), source="unchanged", note=why)
    t0 = time.perf_counter()
    probes = threads.run(time_forwards, models, counts)
    chosen, score = pick(probes, counts)
    threads.set_count(chosen)
    return ThreadChoice(threads=chosen, source="probe", candidates=counts, probes=probes,
                        relative={str(t): round(s, 4) for t, s in score.items()},
                        probe_s=round(time.perf_counter() - t0, 2))

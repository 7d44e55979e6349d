"""Load generation: closed loop (N conversations in flight), open loop (seeded Poisson arrivals) and trace
replay (each job at its recorded arrival time, scaled by a speed factor).

A job is one conversation (its turns run back to back). Each job gets its index and its arrival
time (perf_counter): in a closed loop the moment a slot freed, in an open loop or a replay its scheduled
arrival, so lateness of the harness or a queue in the backend shows up as waiting time.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Awaitable, Callable

Job = Callable[[int, float], Awaitable[None]]
NextIndex = Callable[[], "int | None"]  # the next job to issue, or None when done


async def closed_loop(job: Job, next_index: NextIndex, concurrency: int) -> None:
    """Keep `concurrency` jobs in flight until next_index runs out. A failing job stops them all."""

    async def worker() -> None:
        while (i := next_index()) is not None:
            await job(i, time.perf_counter())

    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None


def poisson_arrivals(rate: float, seed: int) -> Callable[[], float]:
    """Successive inter-arrival gaps (seconds) of a Poisson process, reproducible from the seed."""
    rng = random.Random(seed)
    return lambda: rng.expovariate(rate)


async def open_loop(job: Job, next_index: NextIndex, rate: float, *, seed: int = 0, max_in_flight: int = 1024) -> None:
    """Start jobs at Poisson arrival times regardless of completions (bounded by max_in_flight)."""
    gap = poisson_arrivals(rate, seed)
    elapsed = 0.0

    def offset(_: int) -> float:
        nonlocal elapsed
        elapsed += gap()
        return elapsed

    await scheduled(job, next_index, offset, max_in_flight=max_in_flight)


async def replay(job: Job, next_index: NextIndex, arrival_s: Callable[[int], float], speed: float = 1.0, *,
                 max_in_flight: int = 1024) -> None:
    """Start job i at arrival_s(i) / speed seconds after the start (a trace's own spacing), whatever completes."""
    await scheduled(job, next_index, lambda i: arrival_s(i) / speed, max_in_flight=max_in_flight)


async def scheduled(job: Job, next_index: NextIndex, offset: Callable[[int], float], *,
                    max_in_flight: int = 1024) -> None:
    """Start job i at t0 + offset(i) (offsets non-decreasing in issue order), bounded by max_in_flight."""
    slots = asyncio.Semaphore(max_in_flight)
    tasks: set[asyncio.Task] = set()
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    async def run(i: int, arrival: float) -> None:
        try:
            await job(i, arrival)
        except Exception as exc:  # surfaced after the loop; the jobs in flight finish first
            errors.append(exc)
        finally:
            slots.release()

    while not errors and (i := next_index()) is not None:
        due = t0 + offset(i)
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await slots.acquire()
        task = asyncio.create_task(run(i, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    if errors:
        raise errors[0]

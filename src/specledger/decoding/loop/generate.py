"""generate(): one request decoded alone, which is the continuous-batching Scheduler holding one sequence.

There is one decoding loop (scheduler.py): generate() adds the request to a Scheduler with max_batch=1 made
for the strategy (its batched drafter, its draft_length policy; no prefix cache, so a call never depends on an
earlier one's prompt) and steps it in the calling thread until the request ends. The scheduler is kept with the
strategy: its drafter's probes and the planner's measurements are paid once, not per call. An exception in
on_tokens (a caller's cancel) or in the request's step ends the generation and is raised here, as is one from
the pass itself. Seeded sampling repeats its tokens under draft_length "fixed" (adaptive drafts follow timed
passes, and each draft takes its own random draws).
"""

from __future__ import annotations

import threading
import weakref

from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import GenerationResult, OnTokens, ScheduledResult, Scheduler
from specledger.decoding.strategy import Strategy

_SOLO: weakref.WeakKeyDictionary[Strategy, Scheduler] = weakref.WeakKeyDictionary()
_LOCKS: weakref.WeakKeyDictionary[Scheduler, threading.Lock] = weakref.WeakKeyDictionary()
_MAKING = threading.Lock()


def solo_scheduler(strategy: Strategy) -> Scheduler:
    """The strategy's batch-of-one scheduler, made on first use."""
    with _MAKING:
        sched = _SOLO.get(strategy)
        if sched is None:
            sched = _SOLO[strategy] = Scheduler(strategy.target, max_batch=1, drafter=strategy.batch_drafter(1),
                                                prefix_cache=False, draft_length=strategy.draft_length)
            _LOCKS[sched] = threading.Lock()
    return sched


def generate(
    strategy: Strategy,
    prompt_ids: list[int],
    sp: SamplingParams | None = None,
    on_tokens: OnTokens | None = None,
) -> GenerationResult:
    sched = solo_scheduler(strategy)
    done: list[ScheduledResult] = []
    with _LOCKS[sched]:  # one caller at a time steps it (threads sharing a strategy take turns)
        sched.add(prompt_ids, sp, on_tokens=on_tokens, on_done=done.append)
        try:
            while not done:
                sched.step()
        except BaseException:
            sched.abort("generate() was interrupted")  # the scheduler is left empty for the next call
            raise
    r = done[0]
    if r.exception is not None:
        raise r.exception
    if r.finish_reason == "error":
        raise RuntimeError(f"generation failed: {r.error}")
    r.params = {**strategy.params(), **r.params}
    return r


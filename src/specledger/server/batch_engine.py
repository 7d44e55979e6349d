"""The server's one engine worker: its jobs go to a continuous-batching Scheduler stepped by a SchedulerThread.

Every strategy is served this way (`--max-batch 1`: one request at a time, the others queued). Each job becomes
a scheduler request: its tokens come back through on_tokens on the worker thread and are handed to the request's
asyncio queue as text deltas; its end comes through the result future (finished, cancelled or failed). A client
that goes away cancels its request in the batch (Job.cancel -> SchedulerThread.cancel), freeing its slot at the next
step. Admission: requests that find a free slot in the batch start at the next step; at most `max_queue` may wait
beyond the free slots, more are refused (QueueFull -> 503), and a draining server refuses new jobs straight away.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from specledger.decoding.loop.worker import SchedulerThread
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import GenerationResult, ScheduledResult, Scheduler
from specledger.errors import SpecLedgerError
from specledger.server.metrics import ServerMetrics
from specledger.server.textstream import TextStream

log = logging.getLogger("specledger.server")


@dataclass
class Delta:
    text: str


@dataclass
class Done:
    result: GenerationResult
    tail: str  # text of the result not yet sent as deltas (streams only)
    queue_s: float


@dataclass
class Failed:
    message: str
    status: int  # 400: the request cannot be served; 500: internal error; 499: cancelled
    code: str | None = None


class QueueFull(Exception):
    pass


class Draining(Exception):
    pass


@dataclass
class Job:
    prompt_ids: list[int]
    sp: SamplingParams
    emit: Callable[[object], None]  # must be thread-safe: called from the worker thread
    text: TextStream | None = None  # set for streaming requests
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    first_token: float | None = None
    generated: int = 0
    on_cancel: Callable[[], None] | None = None  # set on submission: stop the request in the batch

    def cancel(self) -> None:
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel()


class EngineWorker:
    def __init__(self, scheduler: Scheduler, metrics: ServerMetrics, max_queue: int) -> None:
        if max_queue < 0:
            raise SpecLedgerError(f"max queue must be >= 0 (got {max_queue})")
        self.metrics = metrics
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self.accepting = True  # until drained (set under the lock, so no job is admitted after)
        self.scheduler = scheduler
        self._live: dict[int, Job] = {}
        self._worker: SchedulerThread | None = None
        s = scheduler
        metrics.running.set_function(lambda: s.n_running)
        metrics.waiting.set_function(lambda: s.n_waiting)
        metrics.batch_size.set_function(lambda: s.last_batch if s.n_running else 0)
        metrics.batch_rows.set_function(lambda: s.last_rows if s.n_running else 0)
        if s.spec is not None:
            spec = s.spec
            metrics.draft_failures.read = lambda: spec.failures

    def start(self) -> None:
        self._worker = SchedulerThread(self.scheduler, name="specledger-engine")

    @property
    def queued(self) -> int:
        """Waiting beyond the batch's free places (those within them start at the next step)."""
        s = self.scheduler
        return max(0, s.n_waiting - (s.max_batch - s.n_running))

    def drain(self) -> None:
        """Refuse new jobs; those admitted still run."""
        with self._lock:
            self.accepting = False

    def stop(self, timeout: float) -> None:
        """Refuse new jobs, cancel the admitted ones, wait (bounded) for them to leave, stop the thread."""
        self.drain()
        with self._lock:
            jobs = list(self._live.values())
        for job in jobs:
            job.cancel()
        deadline = time.monotonic() + timeout
        while self._live and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._live:
            log.warning("the engine did not stop within %.0f s", timeout)
        if self._worker is not None:
            self._worker.close()

    def enqueue(self, job: Job) -> None:
        """Admit the job (Draining, QueueFull) and hand it to the SchedulerThread (submit: the one hand-off to the
        engine's thread); BadInput (a prompt that cannot run) propagates."""
        assert self._worker is not None, "start() the worker first"
        s = self.scheduler
        with self._lock:
            if not self.accepting:
                raise Draining()
            if s.n_running + s.n_waiting >= s.max_batch + self.max_queue:  # no free place and max_queue waiting
                raise QueueFull()
            rid, fut = self._worker.submit(job.prompt_ids, job.sp, on_tokens=lambda new, t: self._tokens(job, new, t))
            self._live[rid] = job
        worker = self._worker
        job.on_cancel = lambda: worker.cancel(rid)
        if job.cancelled.is_set():  # cancelled before the hook was in place
            worker.cancel(rid)
        fut.add_done_callback(lambda f: self._done(rid, job, f))

    # ---- the worker thread ----

    def _tokens(self, job: Job, new: list[int], t: float) -> None:
        if job.first_token is None:
            job.first_token = t
            self.metrics.ttft.observe(t - job.arrival)
        job.generated += len(new)
        if job.text is not None and (piece := job.text.push(new)):
            job.emit(Delta(piece))

    def _done(self, rid: int, job: Job, fut: Future[ScheduledResult]) -> None:
        with self._lock:
            self._live.pop(rid, None)
        try:
            self._answer(job, fut)
        except Exception as exc:  # noqa: BLE001 - a future's callback must not raise: it would be lost, unanswered
            log.error("answering a request failed: %s: %s", type(exc).__name__, exc)
            job.emit(Failed(f"internal error: {type(exc).__name__}: {exc}", 500, "internal_error"))

    def _count_partial(self, job: Job) -> None:
        if job.first_token is not None:  # the prompt was prefilled
            self.metrics.tokens(len(job.prompt_ids), job.generated)

    def _answer(self, job: Job, fut: Future[ScheduledResult]) -> None:
        """Turn the request's end into its last event: Done, or Failed (500 for an error, 499 when cancelled); a
        future that raised is answered by _done."""
        r = fut.result()
        if r.finish_reason == "error":
            msg = r.error or "unknown"
            log.error("generation failed: %s", msg)
            self._count_partial(job)
            job.emit(Failed(f"internal error during generation: {msg}", 500, "internal_error"))
            return
        self.metrics.queue_time.observe(r.queue_s)
        if r.finish_reason == "cancelled":
            self._count_partial(job)
            job.emit(Failed("cancelled", 499, "cancelled"))
            return
        self.metrics.e2e.observe(time.perf_counter() - job.arrival)
        self.metrics.tokens(len(job.prompt_ids), len(r.token_ids))
        self.metrics.finished(r)
        tail = job.text.finish(r.text) if job.text is not None else ""
        job.emit(Done(r, tail, r.queue_s))

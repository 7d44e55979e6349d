"""Many requests at once: the server's jobs go to a continuous-batching Scheduler stepped by a BatchWorker.

Same interface as EngineWorker (submit, drain, stop, waiting, running), so the routes do not
care which one serves them. Each job becomes a scheduler request: its tokens come back through
on_tokens on the worker thread and are handed to the request's asyncio queue as text deltas;
its end comes through the result future (finished, cancelled or failed). A client that goes
away cancels its request in the batch (Job.cancel -> BatchWorker.cancel), freeing its slot at
the next step. Admission: requests that find a free slot in the batch start at the next step;
at most `max_queue` may wait beyond the free slots, more are refused (QueueFull -> 503).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

from specledger.decoding.batch_worker import BatchWorker
from specledger.decoding.scheduler import ScheduledResult, Scheduler
from specledger.server.engine_worker import Draining, Failed, Job, JobWorker, QueueFull
from specledger.server.metrics import ServerMetrics

log = logging.getLogger("specledger.server")


class BatchEngineWorker(JobWorker):
    def __init__(self, scheduler: Scheduler, metrics: ServerMetrics, max_queue: int) -> None:
        super().__init__(metrics, max_queue)
        self.scheduler = scheduler
        self._live: dict[int, Job] = {}
        self._worker: BatchWorker | None = None
        s = scheduler
        metrics.running.set_function(lambda: s.n_running)
        metrics.waiting.set_function(lambda: s.n_waiting)
        metrics.batch_size.set_function(lambda: s.last_batch if s.n_running else 0)
        metrics.batch_rows.set_function(lambda: s.last_rows if s.n_running else 0)

    def start(self) -> None:
        self._worker = BatchWorker(self.scheduler, name="specledger-engine")

    @property
    def waiting(self) -> int:
        return self.scheduler.n_waiting

    @property
    def running(self) -> int:
        return self.scheduler.n_running

    @property
    def queued(self) -> int:
        """Waiting beyond the batch's free places (those within them start at the next step)."""
        s = self.scheduler
        return max(0, s.n_waiting - (s.max_batch - s.n_running))

    def submit(self, job: Job) -> None:
        """Queue the job in the scheduler; BadInput (a prompt that cannot run) propagates."""
        assert self._worker is not None, "start() the worker first"
        s = self.scheduler
        with self._lock:
            if not self._accepting:
                raise Draining()
            free = s.max_batch - s.n_running - s.n_waiting
            if free <= 0 and s.n_waiting - (s.max_batch - s.n_running) >= self.max_queue:
                raise QueueFull()
            rid, fut = self._worker.submit(job.prompt_ids, job.sp, on_tokens=lambda new, t: self._tokens(job, new, t))
            self._live[rid] = job
        worker = self._worker
        job.on_cancel = lambda: worker.cancel(rid)
        if job.cancelled.is_set():  # cancelled before the hook was in place
            worker.cancel(rid)
        fut.add_done_callback(lambda f: self._done(rid, job, f))

    def _admitted(self) -> list[Job]:
        return list(self._live.values())

    def _wait_stopped(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._live and time.monotonic() < deadline:
            time.sleep(0.01)
        left = bool(self._live)
        if self._worker is not None:
            self._worker.close()
        return not left

    # ---- the worker thread ----

    def _done(self, rid: int, job: Job, fut: Future[ScheduledResult]) -> None:
        with self._lock:
            self._live.pop(rid, None)
        try:
            self._answer(job, fut)
        except Exception as exc:  # noqa: BLE001 - a future's callback must not raise: it would be lost, unanswered
            log.error("answering a request failed: %s: %s", type(exc).__name__, exc)
            job.emit(Failed(f"internal error: {type(exc).__name__}: {exc}", 500, "internal_error"))

    def _answer(self, job: Job, fut: Future[ScheduledResult]) -> None:
        """Turn the request's end into its last event: Done, or Failed (500 for an error, 499 when cancelled)."""
        try:
            r = fut.result()
        except Exception as exc:  # noqa: BLE001 - the future never fails today; answer rather than hang
            r = None
            err = f"{type(exc).__name__}: {exc}"
        if r is None or r.finish_reason == "error":
            msg = err if r is None else (r.error or "unknown")
            log.error("generation failed: %s", msg)
            self._count_partial(job)
            job.emit(Failed(f"internal error during generation: {msg}", 500, "internal_error"))
            return
        job.started = job.arrival + r.queue_s
        self.metrics.queue_time.observe(r.queue_s)
        if r.finish_reason == "cancelled":
            self._count_partial(job)
            job.emit(Failed("cancelled", 499, "cancelled"))
            return
        self._finished(job, r, r.queue_s)

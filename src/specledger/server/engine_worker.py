"""One engine, one request at a time: a worker thread runs generate() for jobs from a bounded queue.

generate() blocks, so it runs off the event loop. Its on_tokens callback turns new tokens into
events (text deltas for streams) handed to the request's own asyncio queue; the same callback
raises when the request was cancelled (its client went away), which ends generate() at once and
frees the engine for the next job. Admission is bounded: at most `max_queue` jobs wait behind
the one being served, and a full queue or a draining server refuses new jobs straight away.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from specledger.decoding.generate import GenerationResult, generate
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.strategy import Strategy
from specledger.engine import threads
from specledger.errors import SpecLedgerError
from specledger.server.metrics import ServerMetrics
from specledger.server.textstream import TextStream

log = logging.getLogger("specledger.server")


@dataclass
class Delta:
    text: str
    t: float


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


class _Cancelled(Exception):
    """Raised from on_tokens to end the generation of a request nobody waits for any more."""


@dataclass
class Job:
    prompt_ids: list[int]
    sp: SamplingParams
    emit: Callable[[object], None]  # must be thread-safe: called from the worker thread
    text: TextStream | None = None  # set for streaming requests
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: float | None = None
    first_token: float | None = None
    generated: int = 0
    on_cancel: Callable[[], None] | None = None  # set by a batching worker: stop the request in the batch

    def cancel(self) -> None:
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel()


class JobWorker:
    """What both workers share: the admission switch, a bounded stop, and the bookkeeping of a job's tokens
    and of its end (metrics, the events handed to the request). Subclasses say which jobs are admitted and
    how to wait for them to leave."""

    def __init__(self, metrics: ServerMetrics, max_queue: int) -> None:
        if max_queue < 0:
            raise SpecLedgerError(f"max queue must be >= 0 (got {max_queue})")
        self.metrics = metrics
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._accepting = True

    @property
    def accepting(self) -> bool:
        return self._accepting

    def drain(self) -> None:
        """Refuse new jobs; those admitted still run."""
        with self._lock:
            self._accepting = False

    def stop(self, timeout: float) -> None:
        """Refuse new jobs, cancel the admitted ones, wait (bounded) for them to leave, stop the thread."""
        self.drain()
        with self._lock:
            jobs = self._admitted()
        for job in jobs:
            job.cancel()
        if not self._wait_stopped(timeout):
            log.warning("the engine did not stop within %.0f s", timeout)

    def _admitted(self) -> list[Job]:
        """The jobs waiting or running (called under the lock)."""
        raise NotImplementedError

    def _wait_stopped(self, timeout: float) -> bool:
        """Wait at most `timeout` s for the admitted jobs to leave and stop the thread; False when they did not."""
        raise NotImplementedError

    def _tokens(self, job: Job, new: list[int], t: float) -> None:
        if job.first_token is None:
            job.first_token = t
            self.metrics.ttft.observe(t - job.arrival)
        job.generated += len(new)
        if job.text is not None and (piece := job.text.push(new)):
            job.emit(Delta(piece, t))

    def _finished(self, job: Job, result: GenerationResult, queue_s: float) -> None:
        self.metrics.e2e.observe(time.perf_counter() - job.arrival)
        self.metrics.tokens(len(job.prompt_ids), len(result.token_ids))
        self.metrics.finished(result)
        tail = job.text.finish(result.text) if job.text is not None else ""
        job.emit(Done(result, tail, queue_s))

    def _count_partial(self, job: Job) -> None:
        if job.first_token is not None:  # the prompt was prefilled
            self.metrics.tokens(len(job.prompt_ids), job.generated)


class EngineWorker(JobWorker):
    def __init__(self, strategy: Strategy, metrics: ServerMetrics, max_queue: int) -> None:
        super().__init__(metrics, max_queue)
        self.strategy = strategy
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._waiting: list[Job] = []
        self._current: Job | None = None
        self._thread = threading.Thread(target=self._run, name="specledger-engine", daemon=True)

    # ---- control (event loop side) ----

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return 0 if self._current is None else 1

    @property
    def queued(self) -> int:
        """Waiting behind another (with the engine idle, the first in line is about to start)."""
        return max(0, len(self._waiting) - (0 if self._current is not None else 1))

    def submit(self, job: Job) -> None:
        with self._lock:
            if not self._accepting:
                raise Draining()
            busy = self._current is not None or self._waiting
            if busy and len(self._waiting) >= self.max_queue:
                raise QueueFull()
            self._waiting.append(job)
            self.metrics.waiting.set(len(self._waiting))
        self._q.put(job)

    def _admitted(self) -> list[Job]:
        return self._waiting + ([self._current] if self._current else [])

    def _wait_stopped(self, timeout: float) -> bool:
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the worker thread ----

    def _run(self) -> None:
        while (job := self._q.get()) is not None:
            with self._lock:
                self._waiting.remove(job)
                self._current = job
                self.metrics.waiting.set(len(self._waiting))
            self.metrics.running.set(1)
            self.metrics.batch_size.set(1)
            try:
                threads.run(self._serve, job)  # the ops on the process's torch thread
            except Exception:  # never let one request take the engine down
                log.exception("engine worker: unexpected failure")
            finally:
                with self._lock:
                    self._current = None
                self.metrics.running.set(0)
                self.metrics.batch_size.set(0)

    def _serve(self, job: Job) -> None:
        if job.cancelled.is_set():
            job.emit(Failed("cancelled", 499, "cancelled"))
            return
        job.started = time.perf_counter()
        self.metrics.queue_time.observe(job.started - job.arrival)

        def on_tokens(new: list[int], t: float) -> None:
            if job.cancelled.is_set():
                raise _Cancelled()
            self._tokens(job, new, t)

        try:
            result = generate(self.strategy, job.prompt_ids, job.sp, on_tokens=on_tokens)
        except _Cancelled:
            self._count_partial(job)
            job.emit(Failed("cancelled", 499, "cancelled"))
            return
        except SpecLedgerError as exc:
            self._count_partial(job)
            job.emit(Failed(str(exc), 400, "invalid_value"))
            return
        except Exception as exc:
            log.exception("generation failed")
            self._count_partial(job)
            job.emit(Failed(f"internal error during generation: {type(exc).__name__}: {exc}", 500, "internal_error"))
            return
        self._finished(job, result, job.started - job.arrival)

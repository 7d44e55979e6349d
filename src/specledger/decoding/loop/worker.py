"""A Scheduler stepped by its own thread, so async callers (a server, the bench backend) await futures.

submit() -- the one hand-off from a caller's thread (a server's event loop, the bench backend's) to the worker --
hands back a concurrent.futures.Future of the request's ScheduledResult (wrap it with asyncio.wrap_future); the
thread steps while anything is waiting or running and sleeps otherwise. A shared pass that raises fails the requests
running in it (the scheduler's failure isolation), and the worker carries on. Each pass runs on the process's torch
thread (engine/threads.py), so several workers never hold more OpenMP teams than there are cores.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import OnTokens, ScheduledResult, Scheduler
from specledger.engine import threads


class SchedulerThread:
    def __init__(self, scheduler: Scheduler, *, name: str = "specledger-batch") -> None:
        self.scheduler = scheduler
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], sp: SamplingParams | None = None, *,
               on_tokens: OnTokens | None = None) -> tuple[int, Future[ScheduledResult]]:
        """Queue a request; (its id, a future of its result). Bad prompts raise BadInput here.

        on_tokens runs on the worker thread (an asyncio caller hands it on with call_soon_threadsafe).
        """
        fut: Future[ScheduledResult] = Future()
        rid = self.scheduler.add(prompt_ids, sp, on_tokens=on_tokens, on_done=fut.set_result)
        self._wake.set()
        return rid, fut

    def cancel(self, rid: int) -> None:
        self.scheduler.cancel(rid)
        self._wake.set()

    def close(self) -> None:
        """Stop the thread after its current pass; requests still queued fail with reason "error"."""
        self._stop = True
        self._wake.set()
        self._thread.join()
        self.scheduler.abort("the batch worker was closed")

    def _loop(self) -> None:
        s = self.scheduler
        while not self._stop:
            if not s.has_work() and not s.has_cancels():
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                threads.run(s.step)
            except Exception as exc:  # noqa: BLE001 - the pass's requests fail; the waiting ones and the worker go on
                s.abort(f"{type(exc).__name__}: {exc}", waiting=False)

"""One thread runs the engine's ops in a server or a benchmark process: the torch thread.

GNU OpenMP (PyTorch's intra-op threads on Linux) keeps a team of worker threads for every thread that has ever
entered a parallel region, for as long as that thread lives. Once a process holds more of them than the machine
has cores, libgomp stops spinning between regions (its throttled spin count) and every region of a decode step
waits for a futex wake-up. A server whose main thread had loaded the model and whose engine thread decoded ran
at half speed on 2 cores: 18.2 against 9.6 ms a token (docs/benchmarks-log.md, session 17). So every op of a
serving or benchmarking process goes through `run`/`future` to one long-lived thread with the process's thread
count, and the thread that first asks gives that count up (it runs whatever it still computes on one core, which
never starts a team).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_thread: threading.Thread | None = None


def _start(n: int) -> None:
    import torch

    global _thread
    torch.set_num_threads(n)
    _thread = threading.current_thread()


def _pool() -> ThreadPoolExecutor:
    import torch  # here: importing this module costs nothing (HTTP-only benchmarks never load torch)

    global _executor
    with _lock:
        if _executor is None:
            n = torch.get_num_threads()
            torch.set_num_threads(1)  # this thread never owns a team of its own
            _executor = ThreadPoolExecutor(1, thread_name_prefix="specledger-torch", initializer=_start,
                                           initargs=(n,))
            _executor.submit(lambda: None).result()  # started now, with n threads
        return _executor


def on_torch_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


def future(fn: Callable[..., T], *args: object) -> Future[T]:
    """fn(*args) on the torch thread, as a future (asyncio callers: asyncio.wrap_future)."""
    if on_torch_thread():
        f: Future[T] = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            f.set_exception(exc)
        return f
    return _pool().submit(fn, *args)


def run(fn: Callable[..., T], *args: object) -> T:
    """fn(*args) on the torch thread, waiting for it (directly where the caller is that thread)."""
    return future(fn, *args).result()


def count() -> int:
    """The intra-op thread count the engine's ops run with: the torch thread's once it has started."""
    import torch

    return run(torch.get_num_threads) if _executor is not None else torch.get_num_threads()


def set_count(n: int) -> None:
    """Set the torch thread's count (starting it); threads started later take it too (torch's process-wide
    default), the callers' own threads stay on one."""
    import torch

    run(torch.set_num_threads, n)

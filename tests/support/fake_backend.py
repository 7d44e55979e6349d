"""A backend that answers without a model: it sleeps for a chosen time and echoes the question, so
timings are set by the test (e.g. a machine that slows down halfway) and outputs are identical across
configurations (an A/A pair)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from specledger.bench.backends.base import Backend, Completion
from specledger.records.config import BenchConfig


class SleepBackend(Backend):
    serial = True

    def __init__(self, config: BenchConfig, calls: list[str], seconds: Callable[[int, BenchConfig], float],
                 tokens: int = 8):
        """`calls` is shared by every backend of a run (it records the order requests reached them);
        `seconds(n, config)` is the service time of the n-th request overall."""
        super().__init__(config)
        self.calls, self.seconds, self.tokens = calls, seconds, tokens

    async def start(self) -> None:
        return None

    async def complete(self, messages, *, max_tokens, min_tokens=None) -> Completion:
        n = len(self.calls)
        self.calls.append(self.config.name)
        start = time.perf_counter()
        await asyncio.sleep(self.seconds(n, self.config))
        end = time.perf_counter()
        k = min(self.tokens, max_tokens)
        text = messages[-1]["content"].split()[0] if messages[-1]["content"].split() else "x"
        ids = [ord(ch) % 50 for ch in (text * k)[:k]]
        step = (end - start) / k
        return Completion(ok=True, start=start, end=end, text=text, first_token=start + step,
                          chunks=[(start + step * (j + 1), 1) for j in range(k)], output_tokens=k,
                          token_ids=ids, finish_reason="length")


def before_request(n: int, act: Callable[[], None]) -> Callable[[BenchConfig], object]:
    """A backend factory for Runner: the real backend of each configuration, calling act() before its nth request
    (a simulated crash raises there; a rotated API key takes effect there)."""
    from specledger.bench.backends.make import make_backend

    class Wrapped:
        def __init__(self, bc: BenchConfig) -> None:
            self.inner, self.n = make_backend(bc), 0

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def complete(self, *a: object, **k: object) -> Completion:
            self.n += 1
            if self.n == n:
                act()
            return await self.inner.complete(*a, **k)

    return Wrapped

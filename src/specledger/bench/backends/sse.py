"""One streamed response of an OpenAI-compatible server: its server-sent events read into a Stream, the ways
it can fail, and the Completion it adds up to (token counts spread over the chunks that carried them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpcore

from specledger.bench.backends.base import Completion
from specledger.bench.telemetry import response_levels


class StreamFailure(Exception):
    def __init__(self, message: str, retry: bool, kind: str):
        super().__init__(message)
        self.retry, self.kind = retry, kind


# The connection failed before any byte of a response arrived: the server never answered this request.
_UNANSWERED = (httpcore.ConnectError, httpcore.ReadError, httpcore.WriteError)
_NO_RESPONSE = "Server disconnected without sending a response"  # httpcore: EOF before the status line


class Stream:
    """Accumulates a stream: content pieces with arrival times, usage, finish reason, extensions."""

    __slots__ = ("pieces", "first", "usage", "finish_reason", "extension", "done", "headers", "echo")

    def __init__(self, echo: str = "") -> None:
        # a prefill (a trailing assistant message) that the server may repeat at the start of its answer:
        # llama-server does, specledger and vLLM (continue_final_message) do not; not the model's words, so not kept
        self.echo = echo
        self.pieces: list[tuple[float, str]] = []
        self.first: float | None = None
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.extension: dict = {}
        self.done = False
        self.headers = False  # the response's status line and headers arrived

    async def read(self, resp: Any, *, chat: bool) -> None:
        """Every event of an httpcore streamed response, in order, each stamped with its arrival time."""
        buf = b""
        async for data in resp.aiter_stream():  # server-sent events, split into lines by hand
            t = time.perf_counter()
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    self.event(line[5:].strip(), t, chat)
        if buf.startswith(b"data:"):
            self.event(buf[5:].strip(), time.perf_counter(), chat)

    def event(self, payload: bytes, t: float, chat: bool) -> None:
        if payload == b"[DONE]":  # the body is still read to its end, so the connection is reused
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise StreamFailure(f"malformed stream chunk: {payload[:80]!r}", retry=False, kind="malformed") from None
        if "error" in chunk:
            raise StreamFailure(f"server error mid-stream: {error_message(json.dumps(chunk))}", retry=False,
                                kind="stream_error")
        self.take(chunk, t, chat=chat)

    def take(self, chunk: dict, t: float, *, chat: bool) -> None:
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if piece and self.echo:
                k = min(len(piece), len(self.echo))
                piece, self.echo = (piece[k:], self.echo[k:]) if piece[:k] == self.echo[:k] else (piece, "")
            if piece:
                if self.first is None:
                    self.first = t
                self.pieces.append((t, piece))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for key in ("specledger", "timings", "metrics"):
            if key in chunk:
                self.extension[key] = chunk[key]

    def text(self) -> str:
        return "".join(p for _, p in self.pieces)


def unanswered(exc: Exception, st: Stream) -> bool:
    """The connection failed before the response's status line: stale, reset or refused."""
    if st.headers:
        return False
    if isinstance(exc, _UNANSWERED):
        return True
    return isinstance(exc, httpcore.RemoteProtocolError) and str(exc).startswith(_NO_RESPONSE)


def completion(st: Stream, start: float, attempts: int, count_tokens: Callable[[str], int | None]) -> Completion:
    """A finished stream as a Completion: output tokens from the server's usage, else `count_tokens`, else one
    per chunk."""
    text = st.text()
    usage = st.usage or {}
    usage_out = usage.get("completion_tokens")
    tok_count = count_tokens(text)
    total = usage_out if usage_out is not None else tok_count if tok_count is not None else len(st.pieces)

    def weight(piece: str) -> float:
        n = count_tokens(piece)
        return float(n) if n is not None else float(len(piece))

    counts = allocate(total, [weight(p) for _, p in st.pieces])
    c = Completion(
        ok=True, start=start, end=time.perf_counter(), text=text, attempts=attempts,
        chunks=[(t, n) for (t, _), n in zip(st.pieces, counts)],
        first_token=st.first, prompt_tokens=usage.get("prompt_tokens"), output_tokens=total,
        usage_output_tokens=usage_out, tokenizer_output_tokens=tok_count,
        finish_reason=st.finish_reason,
    )
    levels, steps, tau, raw = response_levels(st.extension)
    c.levels, c.steps, c.tau, c.extra = levels, steps, tau, raw
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and isinstance(raw.get("timings"), dict):  # llama-server's own report
        cached = raw["timings"].get("cache_n")
    c.cached_prompt_tokens = cached if isinstance(cached, int) else None
    ext = raw.get("specledger") or {}
    for key in ("draft_s", "verify_s", "prefill_s", "draft_prefill_s"):
        if isinstance(ext.get(key), (int, float)):
            setattr(c, key, float(ext[key]))
    return c


def allocate(total: int, weights: list[float]) -> list[int]:
    """Split `total` tokens over chunks in proportion to weights (largest remainder).

    One token per chunk when the counts agree; otherwise every chunk gets at least one when
    there are enough tokens to go round.
    """
    n = len(weights)
    if n == 0:
        return []
    if total == n:
        return [1] * n
    base = [1] * n if total >= n else [0] * n
    rest = total - sum(base)
    w = [max(x, 1e-9) for x in weights]
    s = sum(w)
    shares = [rest * x / s for x in w]
    floor = [int(x) for x in shares]
    left = rest - sum(floor)
    order = sorted(range(n), key=lambda i: shares[i] - floor[i], reverse=True)
    for i in order[:left]:
        floor[i] += 1
    return [b + f for b, f in zip(base, floor)]


def error_message(raw: str) -> str:
    try:
        data = json.loads(raw)
        err = data.get("error", data)
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return str(msg or raw).splitlines()[0][:300]
    except (ValueError, AttributeError):
        return raw.strip().splitlines()[0][:300] if raw.strip() else "(empty body)"

"""Any OpenAI-compatible server over HTTP, streaming (/v1/chat/completions, /v1/completions).

TTFT is the first chunk with content. Token counts come from the server's usage (requested with
stream_options.include_usage), else from a tokenizer if one is configured, else one per chunk;
when a chunk carries several tokens its share is estimated from its text so ITL can be spread.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import httpcore
import httpx

from specledger.bench.backends.base import Backend, Completion
from specledger.bench.config import BenchConfig
from specledger.bench.telemetry import merge_replica_metrics, response_levels
from specledger.errors import BadInput, SpecLedgerError

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class _Failure(Exception):
    def __init__(self, message: str, retry: bool, kind: str):
        super().__init__(message)
        self.retry, self.kind = retry, kind


# The connection failed before any byte of a response arrived: the server never answered this request.
_UNANSWERED = (httpcore.ConnectError, httpcore.ReadError, httpcore.WriteError)
_NO_RESPONSE = "Server disconnected without sending a response"  # httpcore: EOF before the status line
# httpcore writes a request's headers and body in two sends: without TCP_NODELAY the body waits for the ACK of
# the headers (Nagle) while the server's kernel delays that ACK (~40 ms), capping each connection near 25 req/s.
_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class Unauthorized(SpecLedgerError):
    """HTTP 401: the key is missing or wrong. Every further request would fail the same way."""


def transport_backoff_s(retry: int) -> float:
    """The first transport retry goes at once (a stale connection); later ones wait 50, 200, 800 ms."""
    return 0.0 if retry <= 1 else min(1.0, 0.05 * 4 ** (retry - 2))


class OpenAIBackend(Backend):
    serial = False

    def __init__(self, config: BenchConfig):
        super().__init__(config)
        assert config.openai is not None
        self.s = config.openai
        self.replicas = self.s.replicas()  # several: round robin, one request to the next replica
        self.base_url = self.replicas[0]
        self.replica_requests = [0] * len(self.replicas)  # requests sent to each replica (first attempts)
        self._next = 0
        self.model_name = self.s.model_name or config.model
        self._client: httpx.AsyncClient | None = None  # control requests: models, metrics
        # The streamed requests go through httpcore (httpx's transport) directly, one single-connection
        # pool per request in flight, checked out and back in: httpx's per-request layers and a pool
        # that scans every connection on each request cost more than the rest of the harness together.
        self._free: list[list[httpcore.AsyncConnectionPool]] = [[] for _ in self.replicas]  # idle, per replica
        self._all: list[httpcore.AsyncConnectionPool] = []
        self._headers: dict[str, str] = {}
        self._ssl: ssl.SSLContext | None = None
        self._tokenizer: Any = None
        self._server: str = ""
        self._metrics_ok = self.s.scrape_metrics
        self._status = 0
        self._unauthorized_message = ""

    # ---- lifecycle ----

    async def start(self) -> None:
        headers = {}
        if self.s.api_key_env:
            key = os.environ.get(self.s.api_key_env)
            if not key:
                raise BadInput(f"configuration {self.config.name!r}: environment variable "
                               f"{self.s.api_key_env} (api_key_env) is not set")
            headers["Authorization"] = f"Bearer {key}"
        self._headers = headers
        self._hosts = [httpx.URL(u).netloc for u in self.replicas]
        self._client = self._new_client()
        for url in self.replicas:
            await self._wait_reachable(url)
            if self._status == 401:
                break
        if self._status == 401:
            msg = self._unauthorized_message
            await self.close()
            raise Unauthorized(msg)
        if self.s.tokenizer:
            self._tokenizer = await asyncio.to_thread(load_counting_tokenizer, self.s.tokenizer)

    async def _wait_reachable(self, url: str) -> None:
        """Poll until the server at `url` answers anything at all, for at most connect_timeout_s."""
        assert self._client is not None
        deadline = time.monotonic() + self.s.connect_timeout_s
        while True:
            try:
                r = await self._client.get(f"{url}/v1/models", timeout=self.s.connect_timeout_s)
                self._status = r.status_code
                if r.status_code == 401:
                    self._unauthorized_message = self._auth_error(_error_message(r.text))
                if r.status_code == 200:
                    try:
                        ids = [m.get("id") for m in r.json().get("data", [])]
                        self._server = f"models: {', '.join(map(str, ids))}"
                    except (ValueError, AttributeError):
                        pass
                return
            except httpx.TransportError:
                if time.monotonic() >= deadline:
                    await self.close()
                    raise SpecLedgerError(
                        f"cannot reach {url} after {self.s.connect_timeout_s:g} s "
                        f"(configuration {self.config.name!r}); is the server running?") from None
                await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:  # loading CA certificates takes ~40 ms: once, shared by every connection
            import certifi

            self._ssl = ssl.create_default_context(cafile=certifi.where())
        return self._ssl

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, verify=self._ssl_context(),
            timeout=httpx.Timeout(self.s.timeout_s, connect=self.s.connect_timeout_s),
            limits=httpx.Limits(keepalive_expiry=self.s.keepalive_expiry_s),
        )

    def _new_pool(self) -> httpcore.AsyncConnectionPool:
        pool = httpcore.AsyncConnectionPool(ssl_context=self._ssl_context(), max_connections=1,
                                            keepalive_expiry=self.s.keepalive_expiry_s, socket_options=_NODELAY)
        self._all.append(pool)
        return pool

    def _auth_error(self, detail: str) -> str:
        where = f"configuration {self.config.name!r}: {self.base_url} answered HTTP 401 ({detail})"
        if self.s.api_key_env:
            return f"{where}: the key in the environment variable {self.s.api_key_env} (api_key_env) was refused"
        return (f"{where}: the server wants an API key; put it in an environment variable and name that "
                "variable in openai.api_key_env (or --api-key-env)")

    async def close(self) -> None:
        for pool in self._all:
            await pool.aclose()
        self._all, self._free = [], [[] for _ in self.replicas]
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def describe(self) -> str:
        pooling = (f"keep-alive expiry {self.s.keepalive_expiry_s:g} s, transport retries {self.s.transport_retries}, "
                   f"retries {self.s.retries}")
        where = self.base_url if len(self.replicas) == 1 else f"round robin over {', '.join(self.replicas)}"
        if self.s.metrics_urls:
            where += f" (metrics per replica: {', '.join(self.s.metrics_urls)})"
        return f"openai-http {where} api={self.s.api} {self._server} ({pooling})".replace("  ", " ")

    def _metrics_targets(self) -> list[str]:
        if self.s.metrics_urls:
            return self.s.metrics_urls
        if len(self.replicas) > 1:
            return [f"{u}/metrics" for u in self.replicas]
        return [self.s.metrics_url or "/metrics"]

    async def scrape_metrics(self) -> str | None:
        """The server's /metrics; with several replicas, each one's, every sample labelled with its replica
        (counters are then summed over replicas; the client's own per-replica request counts are added as
        `specledger_client:replica_requests_total`). None when any replica cannot be read."""
        if not self._metrics_ok or self._client is None:
            return None
        targets = self._metrics_targets()
        if len(targets) == 1 and not self.s.metrics_urls:
            return await self._scrape(targets[0])
        texts = await asyncio.gather(*(self._scrape(u) for u in targets))
        if any(t is None for t in texts):
            return None
        # the client's counts under the replica's metrics URL when each replica's is its own /metrics
        names = targets if not self.s.metrics_urls else self.replicas
        sent = dict(zip(names, self.replica_requests)) if len(self.replicas) > 1 else {}
        return merge_replica_metrics(dict(zip(targets, texts)), client_requests=sent)  # type: ignore[arg-type]

    async def _scrape(self, url: str) -> str | None:
        assert self._client is not None
        for attempt in range(2):  # once more on a fresh connection when a pooled one had gone stale
            try:
                r = await self._client.get(url, timeout=self.s.connect_timeout_s)
                break
            except httpx.TransportError:
                if attempt:
                    return None
            except httpx.HTTPError:
                return None
        if r.status_code != 200:
            self._metrics_ok = False  # no metrics endpoint: stop asking
            return None
        return r.text

    # ---- one request ----

    def _body(self, messages: list[dict[str, str]], max_new_tokens: int, min_new_tokens: int | None) -> dict:
        sp = self.config.sampling
        body: dict[str, Any] = {
            "model": self.model_name,
            "max_tokens": max_new_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "seed": sp.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if sp.top_k:
            body["top_k"] = sp.top_k
        if sp.stop:
            body["stop"] = sp.stop
        if min_new_tokens:
            body["min_tokens"] = min_new_tokens
        if self.s.api == "chat":
            body["messages"] = messages
        else:
            body["prompt"] = self._prompt_text(messages)
        body.update(self.s.extra_body)
        return body

    def _prompt_text(self, messages: list[dict[str, str]]) -> str:
        if len(messages) == 1:
            return messages[0]["content"]
        if self._tokenizer is not None and hasattr(self._tokenizer, "chat_text"):
            return self._tokenizer.chat_text(messages)
        return "\n\n".join(m["content"] for m in messages)

    async def complete(self, messages: list[dict[str, str]], *, max_new_tokens: int,
                       min_new_tokens: int | None = None) -> Completion:
        assert self._client is not None, "start() first"
        body = self._body(messages, max_new_tokens, min_new_tokens)
        path = "/v1/chat/completions" if self.s.api == "chat" else "/v1/completions"
        replica = self._next
        self._next = (replica + 1) % len(self.replicas)
        self.replica_requests[replica] += 1
        start = time.perf_counter()
        attempts = 0
        transport: list[str] = []  # connections that failed before any response byte: sent again, fresh
        fresh = False
        while True:
            attempts += 1
            state = _Stream()
            try:
                async with asyncio.timeout(self.s.timeout_s):
                    await self._stream(path, body, state, fresh=fresh, replica=replica)
                c = self._finish(state, start, attempts)
                c.transport_retries, c.transport_errors = len(transport), transport
                if len(self.replicas) > 1:
                    c.extra["replica"] = self.replicas[replica]
                return c
            except _Failure as exc:
                error, retry, kind, fresh = str(exc), exc.retry, exc.kind, False
            except TimeoutError:
                error, retry, kind, fresh = f"timed out after {self.s.timeout_s:g} s", True, "timeout", True
            except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                retry, fresh = True, True
                if self._unanswered(exc, state) and len(transport) < self.s.transport_retries:
                    transport.append(error)
                    attempts -= 1  # the server never saw it: not an attempt of this request
                    await asyncio.sleep(transport_backoff_s(len(transport)))
                    continue
                if isinstance(exc, (httpcore.ConnectError, httpcore.ConnectTimeout)):
                    error, kind = f"cannot connect to {self.replicas[replica]}: {error}", "connect"
                elif isinstance(exc, httpcore.TimeoutException):
                    kind = "timeout"
                elif state.headers:
                    error, kind = f"connection dropped mid-stream after {len(state.pieces)} chunks ({error})", "dropped"
                elif self._unanswered(exc, state):
                    error, kind = f"connection closed before any response, {len(transport) + 1} times ({error})", \
                        "disconnected"
                else:
                    kind = "protocol"
            if not retry or attempts > self.s.retries:
                return Completion(ok=False, start=start, end=time.perf_counter(), error=error, error_kind=kind,
                                  attempts=attempts, text=state.text(), first_token=state.first,
                                  transport_retries=len(transport), transport_errors=transport)

    @staticmethod
    def _unanswered(exc: Exception, st: "_Stream") -> bool:
        """The connection failed before the response's status line: stale, reset or refused."""
        if st.headers:
            return False
        if isinstance(exc, _UNANSWERED):
            return True
        return isinstance(exc, httpcore.RemoteProtocolError) and str(exc).startswith(_NO_RESPONSE)

    async def _stream(self, path: str, body: dict, st: "_Stream", *, fresh: bool = False, replica: int = 0) -> None:
        """One streamed request on a pooled connection to `replica` (`fresh`: a new one, never an idle one)."""
        free = self._free[replica]
        pool = self._new_pool() if fresh or not free else free.pop()
        keep = True
        try:
            await self._stream_on(pool, path, body, st, replica)
        except (httpcore.NetworkError, httpcore.ProtocolError):
            keep = st.headers  # its connection failed before a response: the retry's fresh pool replaces it
            raise
        finally:
            if keep:
                free.append(pool)  # a connection that failed is closed: the pool opens a new one
            else:
                self._all.remove(pool)
                await pool.aclose()

    async def _stream_on(self, pool: httpcore.AsyncConnectionPool, path: str, body: dict, st: "_Stream",
                         replica: int = 0) -> None:
        content = json.dumps(body).encode()
        headers = [(b"Host", self._hosts[replica]), (b"Content-Type", b"application/json"), (b"Accept", b"text/event-stream"),
                   (b"Accept-Encoding", b"identity"), (b"Content-Length", str(len(content)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in self._headers.items()]
        timeout = {"connect": self.s.connect_timeout_s, "read": self.s.timeout_s, "write": self.s.timeout_s,
                   "pool": self.s.timeout_s}
        async with pool.stream("POST", self.replicas[replica] + path, headers=headers, content=content,
                               extensions={"timeout": timeout}) as resp:
            st.headers = True
            if resp.status >= 400:
                raw = b""
                async for data in resp.aiter_stream():
                    raw += data
                    if len(raw) > 2000:
                        break
                detail = _error_message(raw[:2000].decode('utf-8', 'replace'))
                if resp.status == 401:
                    raise Unauthorized(self._auth_error(detail))
                raise _Failure(f"HTTP {resp.status}: {detail}", retry=resp.status in _RETRY_STATUS,
                               kind=f"http_{resp.status}")
            chat = self.s.api == "chat"
            buf = b""
            async for data in resp.aiter_stream():  # server-sent events, split into lines by hand
                t = time.perf_counter()
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"data:"):
                        self._event(line[5:].strip(), t, st, chat)
            if buf.startswith(b"data:"):
                self._event(buf[5:].strip(), time.perf_counter(), st, chat)
        if not st.done:
            raise _Failure("stream ended before [DONE] (connection dropped)", retry=True, kind="dropped")

    @staticmethod
    def _event(payload: bytes, t: float, st: "_Stream", chat: bool) -> None:
        if payload == b"[DONE]":  # the body is still read to its end, so the connection is reused
            st.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise _Failure(f"malformed stream chunk: {payload[:80]!r}", retry=False, kind="malformed") from None
        if "error" in chunk:
            raise _Failure(f"server error mid-stream: {_error_message(json.dumps(chunk))}", retry=False,
                           kind="stream_error")
        st.take(chunk, t, chat=chat)

    def _finish(self, st: "_Stream", start: float, attempts: int) -> Completion:
        text = st.text()
        usage = st.usage or {}
        usage_out = usage.get("completion_tokens")
        tok_count = self.count_tokens(text)
        total = usage_out if usage_out is not None else tok_count if tok_count is not None else len(st.pieces)
        counts = _allocate(total, [self._weight(p) for _, p in st.pieces])
        c = Completion(
            ok=True, start=start, end=time.perf_counter(), text=text, attempts=attempts,
            chunks=[(t, n) for (t, _), n in zip(st.pieces, counts)],
            first_token=st.first, prompt_tokens=usage.get("prompt_tokens"), output_tokens=total,
            usage_output_tokens=usage_out, tokenizer_output_tokens=tok_count,
            finish_reason=st.finish_reason,
        )
        levels, steps, tau, raw = response_levels(st.extension)
        c.levels, c.steps, c.tau, c.extra = levels, steps, tau, raw
        ext = raw.get("specledger") or {}
        for key in ("draft_s", "verify_s", "prefill_s", "draft_prefill_s"):
            if isinstance(ext.get(key), (int, float)):
                setattr(c, key, float(ext[key]))
        return c

    def count_tokens(self, text: str) -> int | None:
        if self._tokenizer is None:
            return None
        return _count(self._tokenizer, text)

    def _weight(self, piece: str) -> float:
        n = self.count_tokens(piece)
        return float(n) if n is not None else float(len(piece))


class _Stream:
    """Accumulates a stream: content pieces with arrival times, usage, finish reason, extensions."""

    __slots__ = ("pieces", "first", "usage", "finish_reason", "extension", "done", "headers")

    def __init__(self) -> None:
        self.pieces: list[tuple[float, str]] = []
        self.first: float | None = None
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.extension: dict = {}
        self.done = False
        self.headers = False  # the response's status line and headers arrived

    def take(self, chunk: dict, t: float, *, chat: bool) -> None:
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
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


def _allocate(total: int, weights: list[float]) -> list[int]:
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


def _error_message(raw: str) -> str:
    try:
        data = json.loads(raw)
        err = data.get("error", data)
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return str(msg or raw).splitlines()[0][:300]
    except (ValueError, AttributeError):
        return raw.strip().splitlines()[0][:300] if raw.strip() else "(empty body)"


def _count(tokenizer: Any, text: str) -> int:
    if hasattr(tokenizer, "hf"):  # the engine's Tokenizer
        return len(tokenizer.hf(text, add_special_tokens=False)["input_ids"])
    return len(tokenizer.encode(text, add_special_tokens=False).ids)  # a `tokenizers.Tokenizer`


def load_counting_tokenizer(spec: str) -> Any:
    """A tokenizer.json file (tokenizers) or anything the engine can load a tokenizer from."""
    p = Path(spec).expanduser()
    if p.suffix == ".json":
        if not p.exists():
            raise BadInput(f"tokenizer file {p} does not exist")
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(p))
    from specledger.engine.registry import resolve_model
    from specledger.engine.tokenizer import Tokenizer as EngineTokenizer

    path = resolve_model(spec)
    return EngineTokenizer.from_dir(path, set()) if path.is_dir() else EngineTokenizer.from_gguf(path, set())

"""Any OpenAI-compatible server over HTTP, streaming (/v1/chat/completions, /v1/completions), or one specledger
starts for the configuration (openai.server: bench/managed.py) and stops when the backend closes.

TTFT is the first chunk with content. Token counts come from the server's usage (requested with
stream_options.include_usage), else from a tokenizer if one is configured, else one per chunk;
when a chunk carries several tokens its share is estimated from its text so ITL can be spread.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpcore
import httpx

from specledger.bench.backends.base import Backend, Completion
from specledger.bench.backends.pools import ConnectionPools
from specledger.bench.backends.sse import Stream, StreamFailure, completion, error_message, unanswered
from specledger.records.config import BenchConfig, Sampling
from specledger.bench.managed import ManagedServer
from specledger.bench.synthetic import template_overhead
from specledger.bench.telemetry import merge_replica_metrics
from specledger.errors import BadInput, SpecLedgerError

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class Unauthorized(SpecLedgerError):
    """HTTP 401: the key is missing or wrong. Every further request would fail the same way."""


def transport_backoff_s(retry: int) -> float:
    """The first transport retry goes at once (a stale connection); later ones wait 50, 200, 800 ms."""
    return 0.0 if retry <= 1 else min(1.0, 0.05 * 4 ** (retry - 2))


class OpenAIBackend(Backend):
    serial = False

    def __init__(self, config: BenchConfig, *, log_dir: str | Path = "."):
        """`log_dir`: where a managed server's log goes (`server-<config>.log`)."""
        super().__init__(config)
        assert config.openai is not None
        self.s = config.openai
        self.server = ManagedServer.for_config(config, Path(log_dir)) if self.s.server is not None else None
        self.replicas = self.s.replicas()  # several: round robin, one request to the next replica
        self.base_url = self.replicas[0]
        self.replica_requests = [0] * len(self.replicas)  # requests sent to each replica (first attempts)
        self._next = 0
        self.model_name = self.s.model_name or config.model
        self._client: httpx.AsyncClient | None = None  # control requests: models, metrics
        self._pools = ConnectionPools(len(self.replicas), self.s.keepalive_expiry_s)  # the streamed requests'
        self._headers: dict[str, str] = {}
        self._tokenizer: Any = None
        self._template_tokens: int | None = None  # tokens the chat template adds (the tokenizer's, where it has one)
        self._models: str = ""
        self._metrics_ok = self.s.scrape_metrics

    # ---- lifecycle ----

    async def start(self) -> None:
        """Start the managed server if there is one, then wait until every replica answers; closed on any failure."""
        try:
            if self.server is not None:
                self.base_url = await self.server.start_async()
                self.replicas = [self.base_url]
            await self._connect()
        except BaseException:
            await self.close()
            raise

    async def _connect(self) -> None:
        if self.s.api_key_env:
            key = os.environ.get(self.s.api_key_env)
            if not key:
                raise BadInput(f"configuration {self.config.name!r}: environment variable "
                               f"{self.s.api_key_env} (api_key_env) is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self._hosts = [httpx.URL(u).netloc for u in self.replicas]
        self._client = httpx.AsyncClient(  # control requests
            base_url=self.base_url, headers=self._headers, verify=self._pools.ssl_context(),
            timeout=httpx.Timeout(self.s.timeout_s, connect=self.s.connect_timeout_s),
            limits=httpx.Limits(keepalive_expiry=self.s.keepalive_expiry_s))
        for url in self.replicas:
            await self._wait_reachable(url)
        if self.s.tokenizer:
            self._tokenizer = await asyncio.to_thread(load_counting_tokenizer, self.s.tokenizer)

    async def _wait_reachable(self, url: str) -> None:
        """Poll until the server at `url` answers anything at all, for at most connect_timeout_s (401: Unauthorized,
        every request would fail the same way)."""
        assert self._client is not None
        deadline = time.monotonic() + self.s.connect_timeout_s
        while True:
            try:
                r = await self._client.get(f"{url}/v1/models", timeout=self.s.connect_timeout_s)
                if r.status_code == 401:
                    raise Unauthorized(self._auth_error(error_message(r.text)))
                if r.status_code == 200:
                    try:
                        ids = [m.get("id") for m in r.json().get("data", [])]
                        self._models = f"models: {', '.join(map(str, ids))}"
                    except (ValueError, AttributeError):
                        pass
                return
            except httpx.TransportError:
                if time.monotonic() >= deadline:
                    raise SpecLedgerError(
                        f"cannot reach {url} after {self.s.connect_timeout_s:g} s "
                        f"(configuration {self.config.name!r}); is the server running?") from None
                await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def _auth_error(self, detail: str) -> str:
        where = f"configuration {self.config.name!r}: {self.base_url} answered HTTP 401 ({detail})"
        if self.s.api_key_env:
            return f"{where}: the key in the environment variable {self.s.api_key_env} (api_key_env) was refused"
        return (f"{where}: the server wants an API key; put it in an environment variable and name that "
                "variable in openai.api_key_env (or --api-key-env)")

    async def close(self) -> None:
        try:
            await self._pools.close()
            if self._client is not None:
                await self._client.aclose()
                self._client = None
        finally:
            if self.server is not None:
                self.server.stop()

    def describe(self) -> str:
        pooling = (f"keep-alive expiry {self.s.keepalive_expiry_s:g} s, transport retries {self.s.transport_retries}, "
                   f"retries {self.s.retries}")
        where = self.base_url if len(self.replicas) == 1 else f"round robin over {', '.join(self.replicas)}"
        if self.s.metrics_urls:
            where += f" (metrics per replica: {', '.join(self.s.metrics_urls)})"
        managed = f"managed `{' '.join(self.server.argv)}`; " if self.server is not None else ""
        return f"{managed}openai-http {where} api={self.s.api} {self._models} ({pooling})".replace("  ", " ")

    async def scrape_metrics(self) -> str | None:
        """The server's /metrics; with several replicas, each one's, every sample labelled with its replica
        (counters are then summed over replicas; the client's own per-replica request counts are added as
        `specledger_client:replica_requests_total`). None when any replica cannot be read."""
        if not self._metrics_ok or self._client is None:
            return None
        targets = self.s.metrics_urls or ([f"{u}/metrics" for u in self.replicas] if len(self.replicas) > 1
                                          else [self.s.metrics_url or "/metrics"])
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

    async def gone(self) -> str | None:
        """A managed server whose process exited, or a replica that refuses connections."""
        if self.server is not None and (rc := self.server.exited()) is not None:
            return f"server {self.config.name!r} exited with status {rc} (log {self.server.log_path}: " \
                   f"{self.server.log_tail()})"
        return None if self._client is None else await refusing(self._client, self.replicas,
                                                                 min(5.0, self.s.connect_timeout_s))

    # ---- one request ----

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int,
                       min_tokens: int | None = None, sampling: Sampling | None = None) -> Completion:
        assert self._client is not None, "start() first"
        body = request_body(self.config, self.model_name, messages, max_tokens, min_tokens, self._tokenizer, sampling)
        path = "/v1/chat/completions" if self.s.api == "chat" else "/v1/completions"
        replica = self._next
        self._next = (replica + 1) % len(self.replicas)
        self.replica_requests[replica] += 1
        start = time.perf_counter()
        attempts = 0
        transport: list[str] = []  # connections that failed before any response byte: sent again, fresh
        fresh = False
        echo = messages[-1]["content"] if self.s.api == "chat" and messages[-1]["role"] == "assistant" else ""
        while True:
            attempts += 1
            state = Stream(echo)
            try:
                async with asyncio.timeout(self.s.timeout_s):
                    await self._stream(path, body, state, fresh=fresh, replica=replica)
                c = completion(state, start, attempts, self.count_tokens)
                c.transport_retries, c.transport_errors = len(transport), transport
                if len(self.replicas) > 1:
                    c.extra["replica"] = self.replicas[replica]
                return c
            except StreamFailure as exc:
                error, retry, kind, fresh = str(exc), exc.retry, exc.kind, False
            except TimeoutError:
                error, retry, kind, fresh = f"timed out after {self.s.timeout_s:g} s", True, "timeout", True
            except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                retry, fresh = True, True
                if unanswered(exc, state) and len(transport) < self.s.transport_retries:
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
                elif unanswered(exc, state):
                    error, kind = f"connection closed before any response, {len(transport) + 1} times ({error})", \
                        "disconnected"
                else:
                    kind = "protocol"
            if not retry or attempts > self.s.retries:
                return Completion(ok=False, start=start, end=time.perf_counter(), error=error, error_kind=kind,
                                  attempts=attempts, text=state.text(), first_token=state.first,
                                  transport_retries=len(transport), transport_errors=transport)

    async def _stream(self, path: str, body: dict, st: Stream, *, fresh: bool = False, replica: int = 0) -> None:
        """One streamed request on a pooled connection to `replica` (`fresh`: a new one, never an idle one)."""
        content = json.dumps(body).encode()
        headers = [(b"Host", self._hosts[replica]), (b"Content-Type", b"application/json"), (b"Accept", b"text/event-stream"),
                   (b"Accept-Encoding", b"identity"), (b"Content-Length", str(len(content)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in self._headers.items()]
        timeout = {"connect": self.s.connect_timeout_s, "read": self.s.timeout_s, "write": self.s.timeout_s,
                   "pool": self.s.timeout_s}
        pool = self._pools.checkout(replica, fresh=fresh)
        keep = True
        try:
            async with pool.stream("POST", self.replicas[replica] + path, headers=headers, content=content,
                                   extensions={"timeout": timeout}) as resp:
                st.headers = True
                if resp.status >= 400:
                    raw = b""
                    async for data in resp.aiter_stream():
                        raw += data
                        if len(raw) > 2000:
                            break
                    detail = error_message(raw[:2000].decode('utf-8', 'replace'))
                    if resp.status == 401:
                        raise Unauthorized(self._auth_error(detail))
                    raise StreamFailure(f"HTTP {resp.status}: {detail}", retry=resp.status in _RETRY_STATUS,
                                        kind=f"http_{resp.status}")
                await st.read(resp, chat=self.s.api == "chat")
        except (httpcore.NetworkError, httpcore.ProtocolError):
            keep = st.headers  # its connection failed before a response: the retry's fresh pool replaces it
            raise
        finally:
            await self._pools.checkin(pool, replica, keep=keep)
        if not st.done:
            raise StreamFailure("stream ended before [DONE] (connection dropped)", retry=True, kind="dropped")

    def template_tokens(self) -> int | None:
        """Completions: one message goes as raw text (0). Chat: the server applies its template; known where the
        backend has a tokenizer with that template."""
        if self.s.api != "chat":
            return 0
        if self._template_tokens is None and hasattr(self._tokenizer, "chat"):
            self._template_tokens = template_overhead(self._tokenizer)
        return self._template_tokens

    def count_tokens(self, text: str) -> int | None:
        return None if self._tokenizer is None else _count(self._tokenizer, text)

async def refusing(client: httpx.AsyncClient, urls: list[str], timeout: float) -> str | None:
    """The first of urls that refuses connections, said; None when each answers anything (a slow answer or an HTTP
    error is a server still there)."""
    for url in urls:
        # a transport error is no answer either way: a pooled connection the dead server left, or a server being torn
        # down (SIGKILLed on a loaded host, its listening socket still took the connection): asked again until it
        # answers (there) or refuses (gone), for `timeout` seconds at most
        deadline = time.monotonic() + timeout
        while True:
            try:
                await client.get(f"{url}/v1/models", timeout=timeout)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                return f"{url} refuses connections ({type(exc).__name__}: {exc})"
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            except httpx.HTTPError:
                break
    return None


def request_body(config: BenchConfig, model_name: str | None, messages: list[dict[str, str]], max_tokens: int,
                 min_tokens: int | None, tokenizer: Any = None, sampling: Sampling | None = None) -> dict:
    """The JSON body of one streamed request: chat messages, or (completions API) one prompt text."""
    s, sp = config.openai, sampling or config.sampling
    assert s is not None
    body: dict[str, Any] = {
        "model": model_name,
        "max_tokens": max_tokens,
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
    if min_tokens:
        body["min_tokens"] = min_tokens
    if s.api == "chat":
        body["messages"] = messages
    else:
        body["prompt"] = _prompt_text(messages, tokenizer)
    body.update(s.extra_body)
    return body


def _prompt_text(messages: list[dict[str, str]], tokenizer: Any) -> str:
    if len(messages) == 1:
        return messages[0]["content"]
    if tokenizer is not None and hasattr(tokenizer, "chat_text"):
        return tokenizer.chat_text(messages)
    return "\n\n".join(m["content"] for m in messages)


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

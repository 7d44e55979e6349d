"""A small real OpenAI-compatible HTTP server for the harness tests: deterministic tokens, known delays.

Plain asyncio HTTP/1.1 (keep-alive, chunked server-sent events), bound to 127.0.0.1. Token k of
every answer is the fixed-width text " t%03d" % k, so a chunk's share of tokens is known from its
length. Per request, the prompt steers misbehaviour: "DROP" closes the connection mid-stream,
"ERROR500" answers HTTP 500, "FAILONCE" fails the first attempt of that prompt with 503. A body
field "fake" overrides settings for one request. /metrics exposes vLLM-style speculation counters.
With `idle_close_s` set, a request that arrives on a keep-alive connection idle at least that long is
read and then dropped unanswered (a clean close): what a client sees when a server's idle timer fires
as its request goes out, made deterministic (httpcore: "Server disconnected without sending a response").

Run standalone (for benchmarks): python tests/support/fake_openai_server.py [--port N] [--ttft S] [--gap S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from dataclasses import asdict, dataclass, field, replace


@dataclass
class FakeSettings:
    ttft_s: float = 0.0  # request received -> first chunk
    chunk_gap_s: float = 0.0  # between chunks
    tokens_per_chunk: int = 1
    n_tokens: int | None = None  # default: the request's max_tokens
    prompt_tokens: int = 7
    send_usage: bool = True  # honour stream_options.include_usage
    spec_steps: int = 0  # > 0: add a `specledger` extension and count vLLM-style drafts
    draft_per_step: int = 3
    accepted_per_step: int = 2
    llama_timings: bool = False
    # vLLM `--per-request-spec-decode-metrics summary`: the final chunk's metrics.speculative_decoding, built from
    # this acceptance histogram (index j: verification steps that accepted exactly j of draft_per_step drafts)
    vllm_histogram: list[int] | None = None
    drop_after_chunks: int = 2  # for prompts containing DROP
    drop_if: list[str] = field(default_factory=list)  # also drop prompts containing any of these
    model: str = "fake-model"
    idle_close_s: float | None = None  # per connection (server-wide setting): see the module docstring
    api_key: str | None = None  # server-wide: /v1/* without "Authorization: Bearer <key>" gets 401


@dataclass
class FakeStats:
    requests: int = 0
    completed: int = 0
    dropped: int = 0
    unauthorized: int = 0
    idle_closed: int = 0  # requests dropped unanswered on a connection left idle (idle_close_s)
    errors: int = 0
    tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    seen_prompts: dict = field(default_factory=dict)


def token_text(k: int) -> str:
    return f" t{k % 1000:03d}"


class FakeOpenAIServer:
    def __init__(self, settings: FakeSettings | None = None, port: int = 0, fast_loop: bool = False):
        self.settings = settings or FakeSettings()
        self.fast_loop = fast_loop  # uvloop's event loop (for the load-generator benchmark), where installed
        self.stats = FakeStats()
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- lifecycle (in a thread of the test process) ----

    def start(self) -> "FakeOpenAIServer":
        ready = threading.Event()

        def run() -> None:
            if self.fast_loop:
                import uvloop

                self._loop = uvloop.new_event_loop()
            else:
                self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=1024))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()
            self._server.close()
            self._loop.run_until_complete(self._server.wait_closed())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-openai-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- HTTP ----

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            idle_since: float | None = None  # None: no request answered on this connection yet
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                limit = self.settings.idle_close_s
                if limit is not None and idle_since is not None and time.monotonic() - idle_since >= limit:
                    self.stats.idle_closed += 1
                    return
                key = self.settings.api_key
                if key is not None and path.startswith("/v1/") and headers.get("authorization") != f"Bearer {key}":
                    self.stats.unauthorized += 1
                    self._send(writer, 401, b'{"error": {"message": "Invalid API key", "type": "invalid_request_error",'
                                            b' "param": null, "code": "invalid_api_key"}}')
                    await writer.drain()
                    idle_since = time.monotonic()
                    continue
                keep = await self._route(method, path.split("?")[0], body, writer)
                if not keep:
                    return
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()

    def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "application/json") -> None:
        reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: keep-alive\r\n\r\n".encode() + body)

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/v1/models":
            self._send(writer, 200, json.dumps({"object": "list", "data": [
                {"id": self.settings.model, "object": "model", "owned_by": "fake"}]}).encode())
        elif method == "GET" and path == "/metrics":
            self._send(writer, 200, self._metrics().encode(), "text/plain; version=0.0.4")
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return await self._complete(json.loads(body or b"{}"), writer, chat=path.endswith("chat/completions"))
        else:
            self._send(writer, 404, b'{"error": {"message": "not found"}}')
        await writer.drain()
        return True

    def _metrics(self) -> str:
        s = self.stats
        return (
            "# TYPE vllm:spec_decode_num_drafts counter\n"
            f'vllm:spec_decode_num_drafts_total{{model_name="{self.settings.model}"}} {s.drafts}\n'
            "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
            f'vllm:spec_decode_num_draft_tokens_total{{model_name="{self.settings.model}"}} {s.draft_tokens}\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
            f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{self.settings.model}"}} {s.accepted_tokens}\n'
            "# TYPE vllm:request_success counter\n"
            f"vllm:request_success_total {s.completed}\n"
            "# TYPE vllm:generation_tokens counter\n"
            f"vllm:generation_tokens_total {s.tokens}\n"
        )

    async def _complete(self, req: dict, writer: asyncio.StreamWriter, *, chat: bool) -> bool:
        st = replace(self.settings, **req.get("fake", {}))
        self.stats.requests += 1
        prompt = json.dumps(req.get("messages")) if chat else str(req.get("prompt", ""))
        if "ERROR500" in prompt:
            self.stats.errors += 1
            self._send(writer, 500, b'{"error": {"message": "injected failure", "type": "server_error"}}')
            await writer.drain()
            return True
        if "FAILONCE" in prompt and prompt not in self.stats.seen_prompts:
            self.stats.seen_prompts[prompt] = 1
            self.stats.errors += 1
            self._send(writer, 503, b'{"error": {"message": "busy, retry"}}')
            await writer.drain()
            return True
        n = st.n_tokens if st.n_tokens is not None else int(req.get("max_tokens") or 16)
        stream = bool(req.get("stream"))
        t_recv = time.perf_counter()
        pieces = [token_text(k) for k in range(n)]
        groups = [pieces[i:i + st.tokens_per_chunk] for i in range(0, n, st.tokens_per_chunk)]
        usage = {"prompt_tokens": st.prompt_tokens, "completion_tokens": n, "total_tokens": st.prompt_tokens + n}
        ext = None
        if st.spec_steps:
            ext = {"steps": st.spec_steps, "tau": n / st.spec_steps,
                   "levels": [{"name": "draft", "proposed": st.spec_steps * st.draft_per_step,
                               "accepted": st.spec_steps * st.accepted_per_step}]}
            self.stats.drafts += st.spec_steps
            self.stats.draft_tokens += st.spec_steps * st.draft_per_step
            self.stats.accepted_tokens += st.spec_steps * st.accepted_per_step
        rid = f"cmpl-{self.stats.requests}"
        if not stream:
            text = "".join(pieces)
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "model": st.model,
                   "choices": [choice], "usage": usage}
            if ext:
                out["specledger"] = ext
            await asyncio.sleep(st.ttft_s)
            self._send(writer, 200, json.dumps(out).encode())
            await writer.drain()
            self.stats.completed += 1
            self.stats.tokens += n
            return True

        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: keep-alive\r\n\r\n")

        def event(obj: object) -> None:
            data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        if chat:
            event({"id": rid, "object": "chat.completion.chunk", "model": st.model,
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        drop = "DROP" in prompt or any(x in prompt for x in st.drop_if)
        for g, group in enumerate(groups):
            due = t_recv + st.ttft_s + g * st.chunk_gap_s
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if drop and g == st.drop_after_chunks:
                await writer.drain()
                writer.transport.abort()  # mid-stream, no terminating chunk
                self.stats.dropped += 1
                return False
            last = g == len(groups) - 1
            text = "".join(group)
            choice = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": {"content": text}} if chat else {"text": text})
            event({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "model": st.model,
                   "choices": [choice]})
            await writer.drain()
        tail: dict = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                      "model": st.model, "choices": []}
        if st.send_usage and (req.get("stream_options") or {}).get("include_usage"):
            tail["usage"] = usage
        if ext:
            tail["specledger"] = ext
        if st.llama_timings:
            tail["timings"] = {"draft_n": 10, "draft_n_accepted": 7, "predicted_n": n}
        if st.vllm_histogram is not None:
            hist, k = st.vllm_histogram, st.draft_per_step
            steps, acc = sum(hist), sum(j * c for j, c in enumerate(hist))
            tail["metrics"] = {"speculative_decoding": {
                "mean_acceptance_length": 1 + acc / steps, "draft_acceptance_rate": acc / (steps * k),
                "acceptance_histogram": hist, "num_spec_steps": steps, "num_accepted_draft_tokens": acc,
                "num_draft_tokens": steps * k, "num_spec_tokens": k}}
        if len(tail) > 4:
            event(tail)
        event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.stats.completed += 1
        self.stats.tokens += n
        return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--gap", type=float, default=0.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--spec-steps", type=int, default=0, help="> 0: report speculation (see FakeSettings)")
    ap.add_argument("--accepted-per-step", type=int, default=2)
    ap.add_argument("--api-key", default=None, help="/v1/* without this bearer key gets 401")
    ap.add_argument("--uvloop", action="store_true", help="serve on uvloop's event loop (faster; must be installed)")
    args = ap.parse_args()
    server = FakeOpenAIServer(FakeSettings(ttft_s=args.ttft, chunk_gap_s=args.gap,
                                           tokens_per_chunk=args.tokens_per_chunk, spec_steps=args.spec_steps,
                                           accepted_per_step=args.accepted_per_step, api_key=args.api_key),
                              port=args.port,
                              fast_loop=args.uvloop).start()
    print(f"PORT {server.port}", flush=True)
    print(json.dumps(asdict(server.settings)), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()

"""The OpenAI-compatible HTTP server: FastAPI routes over one engine worker, run by uvicorn.

Endpoints: POST /v1/chat/completions, POST /v1/completions (streaming as server-sent events
ending in `data: [DONE]`, or one JSON body), GET /v1/models, GET /health, GET /metrics.

Every completed response carries an extension field `specledger` (in the body, or in the last
chunk of a stream: the usage chunk when `stream_options.include_usage` is set, else the chunk
with `finish_reason`), the per-request speculation statistics the harness records:

    {"strategy": "lookup", "params": {...},
     "steps": 12,            # target verification steps after the first token
     "tau": 2.4,             # tokens appended per step, bonus included (null when no step ran)
     "levels": [{"name": "lookup", "proposed": 40, "accepted": 17, "steps": 12, "drafts": 9,
                 "accepted_per_position": [8, 6, 3], "rate": 0.425, ...}],   # spec_stats.LevelStats
     "ttft_s": 0.11,         # generation start -> first token, every prefill included
     "prefill_s": 0.10,      # the target's prefill
     "draft_prefill_s": 0.0, # drafters' / intermediates' prefill
     "draft_s": 0.01, "verify_s": 0.9, "total_s": 1.0,   # engine time of the generation
     "queue_s": 0.0}         # request received -> generation start (waiting for the engine)

Errors are OpenAI-style bodies {"error": {"message", "type", "param", "code"}}: 400 for invalid
fields (param names the field, e.g. "messages[0].role") and context overflow (code
"context_length_exceeded"), 404 for an unknown model, 503 with Retry-After when the queue is
full (code "queue_full") or the server is shutting down, 500 for an internal error (the server
keeps serving), 401 for /v1/* without a valid key when the server has API keys (server/auth.py;
/health stays open, /metrics too unless closed), 413 for a body over max_body_bytes (server/limits.py: refused
before it is read), 400 "prompt_too_long" for a prompt over max_prompt_chars and "context_length_exceeded" for one
longer than the context can hold whatever its tokens (engine/prompt_bound.py), both refused before it is tokenized.
A body is parsed, validated and tokenized off the event loop, in a worker thread; bodies over LIGHT_BYTES one at a
time (HEAVY_WORKERS), so eight maximal bodies at once neither stall /health nor hold up a small request. A stream that fails after it started ends with a `data: {"error": ...}`
event, then `data: [DONE]`; so does one still running when shutdown's time is up (code "shutting_down").
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Callable, Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from specledger.decoding.loop.scheduler import GenerationResult, Scheduler
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel
from specledger.errors import SpecLedgerError
from specledger.server.auth import ApiKeyMiddleware
from specledger.server.batch_engine import EngineWorker, Delta, Done, Draining, Failed, Job, QueueFull
from specledger.server.connections import READ_TIMEOUT_S, ConnectionLimits, default_max_connections, guarded_protocol
from specledger.server.limits import BodyLimitMiddleware
from specledger.server.metrics import ServerMetrics
from specledger.engine.prompt_bound import text_bound
from specledger.server.schemas import ApiError, ChatCompletionRequest, CompletionRequest, error_body
from specledger.server.textstream import TextStream

log = logging.getLogger("specledger.server")

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MAX_BODY_BYTES = 4 * 2**20  # a whole context of text, JSON-escaped, fits many times over
MAX_PROMPT_CHARS = 1_000_000  # ~250k tokens of English: beyond any context served here; bounds tokenizing time
LIGHT_BYTES = 64 * 2**10  # a body up to this is parsed in any worker thread at once (well under a millisecond)
HEAVY_WORKERS = 1  # larger bodies are parsed and tokenized this many at a time: each competes for the GIL with
# the event loop (a thread of Python work adds ~5 ms, the interpreter's switch interval, to each of the loop's turns)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    data = json.dumps(body, ensure_ascii=False, default=str)
    return Response(data, status_code=status, headers=headers, media_type="application/json")


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, default=str)}\n\n"


def extension(result: GenerationResult, queue_s: float) -> dict[str, Any]:
    """The `specledger` field of a response (documented in the module docstring), in its order."""
    out = {k: getattr(result, k) for k in ("strategy", "params", "steps", "tau")}
    out["levels"] = [lv.model_dump(exclude_none=True) for lv in result.levels]
    times = ("ttft_s", "prefill_s", "draft_prefill_s", "draft_s", "verify_s", "total_s")
    return out | {k: getattr(result, k) for k in times} | {"queue_s": queue_s}


def usage(result: GenerationResult) -> dict[str, int | dict[str, int]]:
    n = len(result.token_ids)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": n, "total_tokens": result.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}


def _param(loc: tuple) -> str | None:
    parts = [x for x in loc if isinstance(x, (str, int))]
    if parts and parts[0] == "body":
        parts = parts[1:]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or None


def validation_error(errors: Any) -> ApiError:
    """The first of pydantic's (or FastAPI's) errors as a 400 naming the field."""
    err = errors[0]
    kind = err.get("type", "")
    if kind == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})")
    param = _param(tuple(err.get("loc", ())))
    if kind == "extra_forbidden":  # refused, not ignored: a typo (max_token) would silently mean no limit
        return ApiError(400, f"unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None:
        return ApiError(400, "the request body is missing or is not a JSON object"
                        if kind in ("missing", "model_attributes_type", "dict_type", "model_type") else msg)
    code = "missing_required_parameter" if kind == "missing" else "invalid_value"
    return ApiError(400, f"{param}: {msg}", param=param, code=code)


HEAVY_SWITCH_S = 0.0005  # the interpreter's thread switch interval while a large body is parsed (default 5 ms)
_heavy: dict[str, float] = {"n": 0, "switch": 0.0}
_heavy_lock = threading.Lock()


@contextmanager
def heavy_parsing() -> Iterator[None]:
    """While a large body is parsed: the cyclic garbage collector off, and the GIL handed round every 0.5 ms.

    Parsing 100k messages makes ~10^6 objects; the collector's full passes over them held the GIL, so the event
    loop, for up to 1.6 s (with it off: 50 ms); the parse makes no cycles, reference counting frees it all. And a
    thread of Python work keeps every other thread (the event loop, the engine between its torch ops) waiting up to
    the switch interval for each turn. Re-entrant across threads: undone when the last one leaves."""
    with _heavy_lock:
        if not _heavy["n"]:
            _heavy["switch"] = sys.getswitchinterval()
            gc.disable()
            sys.setswitchinterval(HEAVY_SWITCH_S)
        _heavy["n"] += 1
    try:
        yield
    finally:
        with _heavy_lock:
            _heavy["n"] -= 1
            if not _heavy["n"]:
                gc.enable()
                sys.setswitchinterval(_heavy["switch"])


class ServerState:
    """What the routes share: the model, the worker, the metrics."""

    def __init__(self, lm: LoadedModel, strategy: Strategy, served_name: str, max_queue: int,
                 max_batch: int = 8, prefill_chunk: int = 256, prefix_cache: bool = True,
                 max_prompt_chars: int = MAX_PROMPT_CHARS, read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int | None = None) -> None:
        self.lm, self.strategy, self.name = lm, strategy, served_name
        self.max_prompt_chars = max_prompt_chars
        # the most text the context can hold, or None (a tokenizer that may delete text): engine/prompt_bound.py
        self.bound = text_bound(getattr(lm.tokenizer, "hf", None))
        self.heavy = ThreadPoolExecutor(HEAVY_WORKERS, thread_name_prefix="specledger-parse")
        self.open: dict[int, tuple[Job, asyncio.Queue]] = {}  # requests being answered, for shutdown to tell
        self.metrics = ServerMetrics(strategy.level_names)
        # what the server's HTTP protocol enforces (server/connections.py)
        self.connections = ConnectionLimits(read_timeout_s, max_connections or default_max_connections(),
                                            self.metrics.read_timeouts.inc, self.metrics.connections_refused.inc)
        # the strategy's drafter, batched; how much each sequence drafts: its draft_length policy, per step
        scheduler = Scheduler(lm, max_batch=max_batch, prefill_chunk=prefill_chunk,
                              drafter=strategy.batch_drafter(max_batch), prefix_cache=prefix_cache,
                              draft_length=strategy.draft_length)
        self.worker = EngineWorker(scheduler, self.metrics, max_queue)
        # said by /health: the kernels the model's table holds (chosen at load: engine/cpu_ops.resolve) and its
        # precision (lm.label: dtype, quantization, int8 activations)
        self.kernel, self.weights = lm.model.ops.path, lm.label
        self.created = int(time.time())
        self.avg_e2e_s = 1.0  # running mean of served requests, for Retry-After

    # ---- request -> job ----

    def check_size(self, req: ChatCompletionRequest | CompletionRequest) -> None:
        """Characters before tokens: a prompt beyond --max-prompt-chars, or longer than the context can hold
        whatever its tokens, is refused before it is tokenized."""
        if isinstance(req, ChatCompletionRequest):
            texts, where = [m.content for m in req.messages], "messages"
            n = sum(len(t) for t in texts)
        else:
            texts, where = ([req.prompt] if isinstance(req.prompt, str) else []), "prompt"
            n = len(req.prompt)
        if n > self.max_prompt_chars:
            raise ApiError(400, f"{where}: the prompt has {n} characters (or token ids); this server takes at most "
                           f"{self.max_prompt_chars} (--max-prompt-chars)", param=where, code="prompt_too_long")
        self.check_fits(texts, where)

    def check_fits(self, texts: list[str], where: str) -> None:
        """Refuse text longer than the context can hold whatever its tokens (prompt_bound.py): the prompt's own
        text before anything else, a conversation's again once its template has wrapped it."""
        if self.bound is None or not texts:
            return
        ctx = self.lm.config.max_seq_len
        size, most = sum(self.bound.size(t) for t in texts), self.bound.per_token * (ctx - 1)
        if size > most:
            unit = self.bound.unit
            raise ApiError(400, f"this model's maximum context length is {ctx} tokens, but the prompt ({where}) has "
                           f"{size} {unit}: more than {ctx - 1} tokens can hold (a token of this model stands for at "
                           f"most {self.bound.per_token} {unit})", param=where, code="context_length_exceeded")

    def prepare(self, body: bytes, model: type[ChatCompletionRequest] | type[CompletionRequest]
                ) -> tuple[ChatCompletionRequest | CompletionRequest, list[int], str]:
        """A body to a request and its prompt's token ids: parsed, validated, sized and tokenized (in a worker
        thread: off_loop); every refusal an ApiError."""
        if not body.strip():
            raise ApiError(400, "the request body is missing or is not a JSON object")
        try:
            req = model.model_validate_json(body)
        except ValidationError as exc:
            req = _reparsed(body, model, exc)
        if req.model and req.model != self.name:
            raise ApiError(404, f"the model {req.model!r} does not exist; this server serves {self.name!r}",
                           param="model", code="model_not_found")
        self.check_size(req)
        ids, where = self.prompt_ids(req)
        return req, ids, where

    async def off_loop(self, body: bytes, model: type[ChatCompletionRequest] | type[CompletionRequest]
                       ) -> tuple[ChatCompletionRequest | CompletionRequest, list[int], str]:
        """prepare() in a worker thread: any for a light body, the HEAVY_WORKERS pool (queued) for a larger one."""
        if len(body) <= LIGHT_BYTES:
            return await asyncio.to_thread(self.prepare, body, model)
        return await asyncio.get_running_loop().run_in_executor(self.heavy, self._prepare_heavy, body, model)

    def _prepare_heavy(self, body: bytes, model: type[ChatCompletionRequest] | type[CompletionRequest]
                       ) -> tuple[ChatCompletionRequest | CompletionRequest, list[int], str]:
        with heavy_parsing():
            return self.prepare(body, model)

    def prompt_ids(self, req: ChatCompletionRequest | CompletionRequest) -> tuple[list[int], str]:
        tok = self.lm.tokenizer
        if tok is None:
            raise ApiError(500, "the model was loaded without a tokenizer", type="server_error")
        if isinstance(req, ChatCompletionRequest):
            try:
                ids = tok.chat([m.as_dict() for m in req.messages], lambda text: self.check_fits([text], "messages"))
                return ids, "messages"
            except SpecLedgerError as exc:
                raise ApiError(400, str(exc), param="messages") from None
        if isinstance(req.prompt, str):
            return tok.encode(req.prompt), "prompt"
        vocab = self.lm.config.vocab_size
        bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary (0..{vocab - 1})",
                           param="prompt", code="invalid_value")
        return list(req.prompt), "prompt"

    def sampling(self, req: ChatCompletionRequest | CompletionRequest, n_prompt: int, where: str) -> SamplingParams:
        ctx = self.lm.config.max_seq_len
        if n_prompt == 0:
            raise ApiError(400, f"{where}: the prompt is empty", param=where, code="invalid_value")
        if n_prompt >= ctx:
            raise ApiError(400, f"this model's maximum context length is {ctx} tokens, but the prompt ({where}) "
                           f"has {n_prompt} tokens", param=where, code="context_length_exceeded")
        field = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
        max_tokens = req.max_tokens_asked or (16 if isinstance(req, CompletionRequest) else ctx - n_prompt)
        if n_prompt + max_tokens > ctx:
            raise ApiError(400, f"this model's maximum context length is {ctx} tokens; the prompt has "
                           f"{n_prompt} tokens and {field} asks for {max_tokens} more", param=field,
                           code="context_length_exceeded")
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_k=max(0, req.top_k),
                                  top_p=req.top_p, seed=req.seed, stop=list(req.stop), ignore_eos=req.ignore_eos,
                                  min_tokens=req.min_tokens)
        except SpecLedgerError as exc:
            raise ApiError(400, str(exc), code="invalid_value") from None

    def admit(self, job: Job) -> None:
        """Enqueue the job in the engine, its refusals as API errors (503 busy or draining, 400 a bad prompt)."""
        try:
            self.worker.enqueue(job)
        except QueueFull:
            w, s = self.worker, self.worker.scheduler
            queued, running = w.queued, s.n_running + s.n_waiting - w.queued  # (starting: admitted at the next step)
            wait = min(60, max(1, math.ceil(self.avg_e2e_s * (queued + 1))))
            raise ApiError(503, f"the server is busy ({running} requests running or starting, {queued} queued, "
                           f"at most {w.max_queue} may queue); retry later",
                           type="server_overloaded", code="queue_full", headers={"Retry-After": str(wait)}) from None
        except Draining:
            raise ApiError(503, "the server is shutting down", type="server_overloaded", code="shutting_down",
                           headers={"Retry-After": "5"}) from None
        except SpecLedgerError as exc:  # the scheduler refused the prompt
            raise ApiError(400, str(exc), code="invalid_value") from None

    def served(self, ev: Done) -> None:
        self.avg_e2e_s = 0.8 * self.avg_e2e_s + 0.2 * (ev.queue_s + ev.result.total_s)

    def interrupt(self) -> None:
        """Shutdown's time is up: every request still being answered ends now with a 503 `shutting_down`
        (a stream: an error event, then [DONE]), so no client is cut off without being told."""
        if self.open:
            log.warning("shutting down: cutting %d request(s) still in flight", len(self.open))
        for job, events in list(self.open.values()):
            events.put_nowait(Failed("the server is shutting down; the request was cut short", 503, "shutting_down"))
            job.cancel()

    # ---- one request ----

    async def handle(self, request: Request, endpoint: str) -> Response:
        # parsing and tokenizing are not torch ops: any thread will do, as long as it is not the event loop's
        model = ChatCompletionRequest if endpoint == CHAT else CompletionRequest
        req, ids, where = await self.off_loop(await request.body(), model)
        sp = self.sampling(req, len(ids), where)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(ev: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
                pass

        job = Job(ids, sp, emit, text=TextStream(self.lm.tokenizer, sp.stop) if req.stream else None)
        self.admit(job)
        rid = ("chatcmpl-" if endpoint == CHAT else "cmpl-") + uuid.uuid4().hex
        self.open[id(job)] = (job, events)
        if req.stream:
            return _stream(self, job, events, req, endpoint, rid)
        try:
            return await self._whole(request, job, events, endpoint, rid)
        finally:
            self.open.pop(id(job), None)

    async def _whole(self, request: Request, job: Job, events: asyncio.Queue, endpoint: str, rid: str) -> Response:
        got = asyncio.ensure_future(events.get())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            answered = got.done()
            if not answered:  # the client went away (or the server is being cancelled): free the engine
                job.cancel()
                got.cancel()
            gone.cancel()
        if not answered:
            self.metrics.request(endpoint, "cancelled")
            return Response(status_code=499)
        ev = got.result()
        if isinstance(ev, Failed):
            raise _failure(ev)
        assert isinstance(ev, Done)
        self.served(ev)
        r = ev.result
        choice: dict[str, Any] = {"index": 0, "finish_reason": r.finish_reason, "logprobs": None}
        if endpoint == CHAT:
            choice["message"] = {"role": "assistant", "content": r.text}
        else:
            choice["text"] = r.text
        body = {"id": rid, "object": "chat.completion" if endpoint == CHAT else "text_completion",
                "created": int(time.time()), "model": self.name, "choices": [choice], "usage": usage(r),
                "specledger": extension(r, ev.queue_s)}
        self.metrics.request(endpoint, 200)
        return _json(body)


def _stream(state: ServerState, job: Job, events: asyncio.Queue, req: Any, endpoint: str, rid: str) -> StreamingResponse:
    """A request's answer as server-sent events, settled once however the stream ends."""
    chat = endpoint == CHAT
    created = int(time.time())
    with_usage = req.include_usage
    outcome: dict[str, str | bool] = {"status": "cancelled", "counted": False}

    def chunk(text: str | None, finish: str | None = None) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        c: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                             "created": created, "model": state.name, "choices": [choice]}
        if with_usage:
            c["usage"] = None
        return c

    def settle() -> None:
        """Once per request, however the stream ended (done, failed, client gone)."""
        if outcome["counted"]:
            return
        outcome["counted"] = True
        state.open.pop(id(job), None)
        if outcome["status"] == "cancelled":
            job.cancel()
        state.metrics.request(endpoint, outcome["status"])

    async def body() -> AsyncIterator[str]:
        try:
            if chat:
                first = chunk("")
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield _sse(first)
            while True:
                ev = await events.get()
                if isinstance(ev, Delta):
                    yield _sse(chunk(ev.text))
                    continue
                if isinstance(ev, Failed):
                    if ev.status != 499:
                        outcome["status"] = str(ev.status)
                        yield _sse(_failure(ev).body())
                        yield "data: [DONE]\n\n"
                    return
                assert isinstance(ev, Done)
                state.served(ev)
                if ev.tail:
                    yield _sse(chunk(ev.tail))
                last = chunk(None, ev.result.finish_reason)
                if with_usage:
                    yield _sse(last)
                    last = {**last, "choices": [], "usage": usage(ev.result)}  # the usage chunk
                last["specledger"] = extension(ev.result, ev.queue_s)
                outcome["status"] = "200"
                yield _sse(last)
                yield "data: [DONE]\n\n"
                return
        finally:
            settle()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers,
                             background=BackgroundTask(settle))


def _reparsed(body: bytes, model: type[ChatCompletionRequest] | type[CompletionRequest],
              exc: ValidationError) -> ChatCompletionRequest | CompletionRequest:
    """A body pydantic's JSON parser refused, read by Python's: it takes lone surrogates ("\\ud800") and NaN, so
    the field that holds one is named (a field that is not text takes it as it is); else the first error, a 400."""
    errors = exc.errors()
    if errors[0].get("type") != "json_invalid":
        raise validation_error(errors) from None
    try:
        obj = json.loads(body)
    except ValueError:  # (UnicodeDecodeError too: not UTF-8)
        raise validation_error(errors) from None
    try:
        return model.model_validate(obj)
    except ValidationError as again:
        raise validation_error(again.errors()) from None


def _failure(ev: Failed) -> ApiError:
    return ApiError(ev.status, ev.message, type="server_error" if ev.status >= 500 else "invalid_request_error",
                    code=ev.code)


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(lm: LoadedModel, strategy: Strategy, *, served_name: str | None = None,
               max_queue: int = 16, stop_timeout_s: float = 10.0, api_keys: list[str] | None = None,
               metrics_require_key: bool = False, max_batch: int = 8, prefill_chunk: int = 256,
               prefix_cache: bool = True, max_body_bytes: int = MAX_BODY_BYTES,
               max_prompt_chars: int = MAX_PROMPT_CHARS, read_timeout_s: float = READ_TIMEOUT_S,
               max_connections: int | None = None) -> FastAPI:
    """The FastAPI application for one loaded model and strategy (the worker starts with the app).

    Every strategy runs up to max_batch requests in one continuously batched pass (max_batch 1: one at a time; at most
    prefill_chunk prompt rows in a pass: smaller chunks shorten the others' stalls and lengthen TTFT); max_queue
    more may wait; prefix_cache: a batched prompt reuses the cache of an earlier request's tokens it starts with.
    With api_keys, /v1/* (and /metrics with metrics_require_key) answer 401 without one. A body over
    max_body_bytes is refused (413) before it is read whole; a prompt over max_prompt_chars before it is tokenized.
    A request whose head and body take longer than read_timeout_s to arrive is answered 408 and its connection
    closed; connections beyond max_connections (default: below the descriptor limit) are answered 503 at once."""
    if max_batch < 1:
        raise SpecLedgerError(f"max batch must be >= 1 (got {max_batch})")
    if prefill_chunk < 1:
        raise SpecLedgerError(f"prefill chunk must be >= 1 (got {prefill_chunk})")
    if max_body_bytes < 1 or max_prompt_chars < 1:
        raise SpecLedgerError(f"size limits must be >= 1 (got {max_body_bytes} bytes, {max_prompt_chars} characters)")
    if not read_timeout_s > 0 or (max_connections is not None and max_connections < 1):
        raise SpecLedgerError(f"the read timeout must be > 0 s and the connection cap >= 1 (got {read_timeout_s} s, "
                              f"{max_connections})")
    state = ServerState(lm, strategy, served_name or lm.name, max_queue, max_batch, prefill_chunk, prefix_cache,
                        max_prompt_chars, read_timeout_s, max_connections)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.worker.start()
        yield
        state.heavy.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(state.worker.stop, stop_timeout_s)

    app = FastAPI(title="specledger", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state

    def refused(status: int) -> Callable[[str], None]:  # a middleware's refusal, counted as the routes' are
        return lambda path: state.metrics.request(path, status) if path in (CHAT, COMPLETIONS) else None

    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes, on_refused=refused(413))
    if api_keys:  # (added last: outermost, so a request without a key is refused before its body is read)
        app.add_middleware(ApiKeyMiddleware, keys=list(api_keys), protect_metrics=metrics_require_key,
                           on_refused=refused(401))
    elif metrics_require_key:
        raise SpecLedgerError("closing /metrics to requests without a key needs a key (--api-key)")

    def counted(request: Request, err: ApiError) -> Response:
        if request.url.path in (CHAT, COMPLETIONS):
            state.metrics.request(request.url.path, err.status)
        return _json(err.body(), err.status, err.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return counted(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return counted(request, validation_error(exc.errors()))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _json(error_body(str(exc.detail), kind), exc.status_code, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return counted(request, ApiError(500, f"internal error: {type(exc).__name__}", type="server_error",
                                         code="internal_error"))

    # (the body is read as bytes and parsed in state.handle, off the event loop: not a FastAPI body parameter)
    @app.post(CHAT)
    async def chat_completions(request: Request) -> Response:
        return await state.handle(request, CHAT)

    @app.post(COMPLETIONS)
    async def completions(request: Request) -> Response:
        return await state.handle(request, COMPLETIONS)

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [{
            "id": state.name, "object": "model", "created": state.created, "owned_by": "specledger",
            "max_model_len": lm.config.max_seq_len, "root": lm.source,
        }]})

    @app.get("/health")
    async def health() -> Response:
        w, s = state.worker, state.worker.scheduler
        body = {"status": "ok" if w.accepting else "draining", "model": state.name, "strategy": strategy.name,
                "running": s.n_running, "waiting": s.n_waiting, "max_queue": w.max_queue, "kernel": state.kernel,
                "weights": state.weights, "max_batch": s.max_batch, "prefill_chunk": s.prefill_chunk, "prefix_cache": s.prefix_cache}
        return _json(body, 200 if w.accepting else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


# ---- running it ------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the server starts so a busy port is a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError, ValueError) as exc:  # (a port out of range, a host with a NUL: not OSError)
        sock.close()
        raise SpecLedgerError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
    sock.set_inheritable(True)
    return sock


class Server(uvicorn.Server):
    """uvicorn, plus: on shutdown the app refuses new requests at once (503) while in-flight ones finish; those
    still running shortly before the graceful timeout ends are told (ServerState.interrupt), then closed. Its HTTP
    protocol times out slow requests and caps connections (server/connections.py)."""

    def __init__(self, app: FastAPI, *, shutdown_timeout_s: float = 30.0, log_level: str = "info",
                 access_log: bool = True) -> None:
        self.app_state: ServerState = app.state.server
        super().__init__(uvicorn.Config(app, log_level=log_level, access_log=access_log,
                                        http=guarded_protocol(self.app_state.connections),
                                        # uvicorn annotates int | None; it only hands it to asyncio.timeout (float)
                                        timeout_graceful_shutdown=shutdown_timeout_s,  # type: ignore[arg-type]
                                        lifespan="on"))

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.app_state.worker.drain()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timeout = self.config.timeout_graceful_shutdown or 0.0
        # the margin leaves the cut requests time to send their last event before uvicorn cancels them
        cut = asyncio.get_running_loop().call_later(max(0.0, timeout - min(1.0, timeout / 2)), self.app_state.interrupt)
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()

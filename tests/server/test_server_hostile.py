"""Hostile and careless requests against `specledger serve` (issue 42): one request never takes down the
others, huge bodies never hold the event loop, wrong types and unknown fields are refused by name, shutdown
tells the streams it cuts, and `serve`'s argument errors are one line."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest

from specledger.decoding.factory import make_strategy
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import Scheduler
from specledger.server.app import ServerState, create_app
from tests.support.server_thread import ServerThread
from tests.support.varied_model import run_all
from specledger.server.batch_engine import Job
from specledger.server.schemas import ApiError

MODEL = "smollm2-135m"
CHAT = [{"role": "user", "content": "Name a colour."}]
BAD_SEED = 2**64  # one past what a generator takes: "Overflow when unpacking long long" in manual_seed


@contextmanager
def server_logs() -> Iterator[list[logging.LogRecord]]:
    """Every record the server's loggers (and uvicorn's, which do not propagate) emit meanwhile."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(level=logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "specledger")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield records
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def tracebacks(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.fixture(scope="module")
def srv(smollm):
    """A batch of 16; limits raised so a 2M-character prompt reaches the tokenizer (the default is 1M)."""
    app = create_app(smollm, make_strategy("ar", target=smollm), max_queue=16, max_batch=16,
                     max_body_bytes=16 * 2**20, max_prompt_chars=4_000_000)
    with ServerThread(app) as s:
        yield s


@pytest.fixture(scope="module")
def small(smollm):
    """Small limits, to reach them cheaply."""
    app = create_app(smollm, make_strategy("ar", target=smollm), max_body_bytes=10_000, max_prompt_chars=1000)
    with ServerThread(app) as s:
        yield s


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}, body
    return body["error"]


# ---- one request kills the batch ------------------------------------------------------------------


def test_one_hostile_seed_among_16_running_fails_alone(srv):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, httpx.Response, list[str]]:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, "temperature": 0.8, "ignore_eos": True,
                "seed": BAD_SEED if i == 7 else i, "stream": i % 2 == 0}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            await r.aread()
            events = [x[5:].strip() for x in r.text.splitlines() if x.startswith("data:")]
        return i, r, events

    async def run() -> list:
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(16)))

    with server_logs() as records:
        results = asyncio.run(asyncio.wait_for(run(), timeout=240))
    ok = [(i, r, ev) for i, r, ev in results if i != 7]
    assert all(r.status_code == 200 for _, r, _ in ok), [(i, r.status_code, r.text[:200]) for i, r, _ in ok]
    for i, r, events in ok:
        if i % 2 == 0:
            assert events[-1] == "[DONE]" and not any('"error"' in e for e in events)
        else:
            assert r.json()["usage"]["completion_tokens"] == 4
    [(_, bad, _)] = [x for x in results if x[0] == 7]
    assert bad.status_code == 400 and error_of(bad)["param"] == "seed"
    assert tracebacks(records) == []
    assert httpx.get(srv.url + "/health").json()["running"] == 0


@pytest.fixture(scope="module")
def tiny():
    from tests.conftest import tiny_model

    return tiny_model(seed=3)


def test_scheduler_fails_one_request_alone_at_admission_and_in_its_callbacks(tiny):
    """Past the API's bounds (the bench backend submits to a scheduler directly): a seed no generator takes,
    a sampling that raises (a top_k set wrong after the checks) and a caller's on_tokens that raises fail their
    own request; the others finish as if alone."""
    sched = Scheduler(tiny, max_batch=6)

    def boom(new: list[int], t: float) -> None:
        raise RuntimeError("the caller's hook broke")

    sp = SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True)
    good = [sched.add([1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True)) for _ in range(2)]
    bad_seed = sched.add([1, 2, 3], SamplingParams(max_tokens=5, temperature=1.0, seed=BAD_SEED,
                                                      ignore_eos=True))
    bad_hook = sched.add([4, 5], sp, on_tokens=boom)
    broken = SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True)
    broken.top_k = -5  # torch.topk raises on the first token
    bad_sampling = sched.add([6, 7], broken)
    told: list[str | None] = []

    def bad_done(r) -> None:  # the caller's end-of-request hook raises: still told, once more, as an error
        told.append(r.finish_reason)
        raise RuntimeError("the caller's on_done broke")

    sched.add([8, 9], SamplingParams(max_tokens=2, ignore_eos=True), on_done=bad_done)
    done = {r.request_id: r for r in run_all(sched)}
    assert {rid: done[rid].finish_reason for rid in good} == {rid: "length" for rid in good}
    assert all(len(done[rid].token_ids) == 5 for rid in good)
    assert done[bad_seed].finish_reason == "error" and "Overflow" in (done[bad_seed].error or "")
    assert done[bad_hook].finish_reason == "error" and "hook broke" in (done[bad_hook].error or "")
    assert done[bad_sampling].finish_reason == "error" and done[bad_sampling].token_ids == []
    assert told == ["length", "error"]
    assert sched.n_running == sched.n_waiting == 0
    # the slots came back: the next batch runs whole
    again = [sched.add([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True)) for _ in range(4)]
    assert {r.request_id: r.finish_reason for r in run_all(sched)} == {rid: "length" for rid in again}


def test_a_failed_pass_fails_its_requests_not_the_waiting_ones(tiny):
    from specledger.decoding.loop.worker import SchedulerThread

    sched = Scheduler(tiny, max_batch=1)
    real = sched.runner.forward
    calls = {"n": 0}

    def first_fails(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected pass failure")
        return real(*a, **k)

    sched.runner.forward = first_fails  # type: ignore[method-assign]
    worker = SchedulerThread(sched)
    try:
        futs = [worker.submit([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))[1] for _ in range(3)]
        results = [f.result(timeout=60) for f in futs]
    finally:
        worker.close()
    assert [r.finish_reason for r in results] == ["error", "length", "length"]


# ---- size limits, tokenizing off the event loop ---------------------------------------------------


def poll_health(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            assert c.get(url + "/health").status_code == 200
            out.append(time.perf_counter() - t0)


@contextmanager
def health_meanwhile(url: str) -> Iterator[list[float]]:
    lat: list[float] = []
    stop = threading.Event()
    t = threading.Thread(target=poll_health, args=(url, stop, lat))
    t.start()
    try:
        while not lat:  # the poller is under way
            time.sleep(0.001)
        yield lat
    finally:
        stop.set()
        t.join(60)


def raw_post(url: str, path: str, length: int, body: Iterator[bytes], chunked: bool = False) -> tuple[bytes, int]:
    """A request sent over a plain socket, its body written while the answer is read (the server may answer
    before it has read the body, and close); (the answer's head, the body bytes the socket took)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {length}\r\n"

    sent = [0]

    def write() -> None:
        try:
            sock.sendall((head + "\r\n").encode())
            for piece in body:
                for i in range(0, len(piece), 65536):
                    part = piece[i:i + 65536]
                    sock.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                    sent[0] += len(part)
        except OSError:  # the server answered and closed: expected
            pass

    writer = threading.Thread(target=write)
    writer.start()
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            data = sock.recv(65536)
            if not data:
                break
            got += data
    finally:
        sock.close()
        writer.join(60)
    return got, sent[0]


MB30 = 30 * 2**20


def big_body() -> Iterator[bytes]:
    yield b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "'
    for _ in range(MB30 // 2**20):
        yield b"a" * 2**20
    yield b'"}]}'


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_30mb_body_is_413_before_it_is_read_and_health_stays_quick(srv, chunked):
    with server_logs() as records, health_meanwhile(srv.url) as lat:
        t0 = time.perf_counter()
        got, sent = raw_post(srv.url, "/v1/chat/completions", MB30 + 100, big_body(), chunked=chunked)
        took = time.perf_counter() - t0
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    print(f"\n30 MB body ({'chunked' if chunked else 'Content-Length'}): 413 after {took * 1000:.0f} ms, "
          f"{sent / 2**20:.1f} MiB sent; /health meanwhile: {len(lat)} polls, max {max(lat) * 1000:.1f} ms")
    if not chunked:  # refused on its header: the body was never read (the socket buffers took what went)
        assert sent < 16 * 2**20
    assert max(lat) < 2.0  # (a generous bound on a busy machine: measured ~ms; the issue saw 33.6 s)
    assert tracebacks(records) == []


def test_a_long_prompt_is_tokenized_off_the_event_loop(srv):
    """585k characters (~1 s to tokenize here: within the limits, and within what the context could hold were every
    token the vocabulary's longest): refused after tokenizing (context), while /health keeps answering."""
    body = {"model": MODEL, "prompt": "The quick brown fox jumps over the lazy dog. " * 13_000, "max_tokens": 1}
    with health_meanwhile(srv.url) as lat:
        t0 = time.perf_counter()
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
        took = time.perf_counter() - t0
    assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"
    print(f"\n2M-character prompt: 400 after {took * 1000:.0f} ms; /health meanwhile: {len(lat)} polls, "
          f"max {max(lat) * 1000:.1f} ms")
    assert max(lat) < min(2.0, took / 2)


def test_small_limits_body_and_prompt_characters(small):
    r = httpx.post(small.url + "/v1/completions", json={"model": MODEL, "prompt": "x" * 20_000})
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large" and "10000" in error_of(r)["message"]
    r = httpx.post(small.url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": [{"role": "user", "content": "y" * 600}] * 2})
    assert r.status_code == 400 and error_of(r)["code"] == "prompt_too_long" and error_of(r)["param"] == "messages"
    r = httpx.post(small.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200


# ---- strict request validation ------------------------------------------------------------------


@pytest.mark.parametrize("extra,param", [
    ({"max_tokens": "4"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 4.0}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"temperature": "0.5"}, "temperature"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi", "contnet": "x"}]}, "messages[0].contnet"),
    ({"max_token": 4}, "max_token"),
    ({"response_format": {"type": "json_object"}}, "response_format.type"),
    ({"seed": BAD_SEED}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"seed": "1"}, "seed"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_wrong_types_and_unknown_fields_are_400_naming_the_field(small, extra, param):
    r = httpx.post(small.url + "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 1,
                                                             **extra})
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["param"] == param and param.split(".")[-1].split("[")[0] in err["message"], err


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "text"}},
    {"user": "u-1", "n": 1, "metadata": {"k": "v"}, "store": False, "logprobs": False, "tool_choice": "none",
     "parallel_tool_calls": False, "stop": None, "service_tier": "auto"},
    {"stream": True, "stream_options": {"include_usage": True}},
    {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},  # GuideLLM's
     "max_completion_tokens": 1, "ignore_eos": True},
    {"seed": 2**64 - 1, "temperature": 1},
    {"seed": -(2**63), "temperature": 1},
    {"max_completion_tokens": 1, "max_tokens": 1, "ignore_eos": True, "min_tokens": 1, "top_k": 5, "top_p": 0.9},
    {"messages": [{"role": "system", "content": "Be brief.", "name": "sys"},
                  {"role": "assistant", "content": "ok", "refusal": None, "tool_calls": None, "function_call": None,
                   "audio": None, "annotations": []},
                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
])
def test_harmless_openai_fields_are_accepted(small, extra):
    r = httpx.post(small.url + "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 1,
                                                             **extra})
    assert r.status_code == 200, r.text


def test_what_our_harness_and_the_openai_client_send_is_accepted(small):
    from types import SimpleNamespace

    from specledger.bench.backends.openai_http import request_body

    client = openai.OpenAI(base_url=small.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=1, temperature=0.0, seed=3,
                                       top_p=1.0, stop=["\n"], user="u", n=1, response_format={"type": "text"})
    assert r.usage.completion_tokens == 1
    r2 = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0, seed=1, echo=False)
    assert r2.usage.completion_tokens == 1
    sp = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=11, stop=["@@never@@"])
    for api in ("chat", "completions"):
        config = SimpleNamespace(openai=SimpleNamespace(api=api, extra_body={"ignore_eos": True}), sampling=sp)
        body = request_body(config, MODEL, CHAT, 2, 1)  # type: ignore[arg-type]
        path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        with httpx.stream("POST", small.url + path, json=body, timeout=60) as resp:
            assert resp.status_code == 200, resp.read()
            events = [x[5:].strip() for x in resp.iter_lines() if x.startswith("data:")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 2


# ---- busy and shutdown -------------------------------------------------------------------------


def test_503_counts_what_runs_or_starts_apart_from_what_queues(tiny):
    """Requests within the batch's free places start at the next step: they are not "queued"."""
    state = ServerState(tiny, make_strategy("ar", target=tiny), "tiny", max_queue=0, max_batch=2)
    worker = state.worker
    sched = worker.scheduler  # type: ignore[union-attr]

    class Unstepped:  # the worker thread is not started: what was submitted stays waiting
        def submit(self, ids, sp, on_tokens=None):
            from concurrent.futures import Future

            return sched.add(ids, sp, on_tokens=on_tokens), Future()

        def cancel(self, rid: int) -> None:
            pass

    worker._worker = Unstepped()  # type: ignore[union-attr,assignment]
    for _ in range(2):
        state.admit(Job([1, 2], SamplingParams(max_tokens=2), lambda ev: None))
    with pytest.raises(ApiError) as exc:
        state.admit(Job([1, 2], SamplingParams(max_tokens=2), lambda ev: None))
    assert exc.value.status == 503
    assert "2 requests running or starting, 0 queued, at most 0 may queue" in exc.value.message


def test_shutdown_tells_every_stream_it_cuts(smollm):
    app = create_app(smollm, make_strategy("ar", target=smollm), max_queue=8, max_batch=8)
    s = ServerThread(app, shutdown_timeout_s=1.0).start()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
            "stream": True}

    async def run() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
            streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(8)]
            opened = [await st.__aenter__() for st in streams]
            lines = [r.aiter_lines() for r in opened]
            seen: list[list[str]] = [[] for _ in streams]
            for it, got in zip(lines, seen):  # each has produced its first text
                async for line in it:
                    if line.startswith("data:"):
                        got.append(line[5:].strip())
                        break
            await asyncio.to_thread(s.server.handle_exit, signal.SIGTERM, None)  # what SIGTERM does

            async def rest(it, got: list[str]) -> None:
                async for line in it:
                    if line.startswith("data:"):
                        got.append(line[5:].strip())

            await asyncio.gather(*(rest(it, got) for it, got in zip(lines, seen)))
            for st in streams:
                await st.__aexit__(None, None, None)
            return seen

    with server_logs() as records:
        seen = asyncio.run(asyncio.wait_for(run(), timeout=120))
        s.thread.join(30)
    assert not s.thread.is_alive()
    for events in seen:
        assert events[-1] == "[DONE]", events[-3:]
        assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    assert [r.getMessage() for r in records if r.exc_info] == []
    assert not any("Cancel" in r.getMessage() for r in records)  # uvicorn never had to cancel one


# ---- the command line ---------------------------------------------------------------------------


@pytest.mark.parametrize("args,says", [
    (["--port", "99999"], "--port must be in 0..65535"),
    (["--port", "abc"], "'--port'"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
    (["--max-body-bytes", "0"], "--max-body-bytes"),
    (["--log-level", "loud"], "--log-level"),
    (["--read-timeout", "0"], "--read-timeout"),
    (["--max-connections", "99999999"], "ulimit -n"),
])
def test_serve_argument_errors_are_one_line_exit_2(args, says):
    p = subprocess.run([sys.executable, "-m", "specledger.cli", "serve", *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], p.stderr

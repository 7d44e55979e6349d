"""Slow and numerous connections against `specledger serve` (issue 56; server/connections.py): a request whose head
or body trickles in is answered 408 and closed after --read-timeout; connections past --max-connections are
answered 503 at once, never left unanswered; a request beside them is answered throughout."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from specledger.decoding.factory import make_strategy
from specledger.server.app import create_app
from specledger.server.connections import RESERVED_FDS, default_max_connections
from tests.server.test_server_draft_failures import metric
from tests.server.test_server_hostile import server_logs, tracebacks
from tests.support.server_thread import ServerThread

MODEL = "smollm2-135m"
READ_TIMEOUT = 1.5
PACE = 0.3  # seconds between a slow client's pieces
VICTIM = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2, "ignore_eos": True}


@pytest.fixture(scope="module")
def srv(smollm):
    app = create_app(smollm, make_strategy("ar", target=smollm), read_timeout_s=READ_TIMEOUT, max_connections=40)
    with ServerThread(app) as s:
        yield s


async def trickle(port: int, head_done: bool, limit_s: float) -> tuple[bytes, float]:
    """A slowloris client: a header line (or, head_done, a body byte) every PACE seconds until the server answers or
    closes, or limit_s passes; (what it answered, seconds until then)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    if head_done:
        writer.write(b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    got = b""
    try:
        for i in range(int(limit_s / PACE)):
            try:
                got = await asyncio.wait_for(reader.read(4096), PACE)  # the server's answer, or the next piece
                break
            except asyncio.TimeoutError:
                writer.write(b" " if head_done else f"X-Slow-{i}: {i}\r\n".encode())
                await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
    return got, time.perf_counter() - t0


def test_slow_heads_and_bodies_are_answered_408_and_closed_while_a_request_is_served(srv):
    port = int(srv.url.rsplit(":", 1)[1])
    before = metric(srv.url, "specledger:read_timeouts_total")

    async def run() -> tuple[list, httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            slow = [trickle(port, head_done=i % 3 == 0, limit_s=8 * READ_TIMEOUT) for i in range(30)]
            *closed, victim = await asyncio.gather(*slow, client.post("/v1/completions", json=VICTIM))
        return closed, victim

    with server_logs() as records:
        closed, victim = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert victim.status_code == 200 and victim.json()["usage"]["completion_tokens"] == 2
    for got, took in closed:  # each answered 408 once its request was READ_TIMEOUT late, none held to the end
        assert got.startswith(b"HTTP/1.1 408") and b"request_timeout" in got, got[:200]
        assert READ_TIMEOUT * 0.9 < took < 6 * READ_TIMEOUT
    assert metric(srv.url, "specledger:read_timeouts_total") - before == 30
    said = [r.getMessage() for r in {id(r): r for r in records}.values() if r.name.startswith("specledger")]
    assert len(said) == 5 and all("--read-timeout" in m for m in said), said  # the 1st, 2nd, 4th, 8th, 16th
    assert tracebacks(records) == []


def test_a_request_arriving_in_time_is_not_cut(srv):
    """The limit is on arriving, not on answering: a body sent in pieces within it, then a long answer."""
    port = int(srv.url.rsplit(":", 1)[1])
    body = b'{"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": true}'

    async def run() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 40):
            writer.write(body[i:i + 40])
            await writer.drain()
            await asyncio.sleep(READ_TIMEOUT / 6)  # (the pacing of a slow client, well within the limit)
        got = await reader.read(65536)
        writer.close()
        return got

    got = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert got.startswith(b"HTTP/1.1 200"), got[:300]


def test_connections_past_the_cap_get_503_at_once_then_service_resumes(smollm):
    app = create_app(smollm, make_strategy("ar", target=smollm), read_timeout_s=3.0, max_connections=6)
    with ServerThread(app) as s:
        port = int(s.url.rsplit(":", 1)[1])

        async def run() -> tuple[list[bytes], httpx.Response, httpx.Response]:
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(6)]  # the cap, silent
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
                busy = await client.post("/v1/completions", json=VICTIM)  # answered: 503, not left waiting
                # the silent ones are closed at their read timeout (408); then the next request is served
                closed = [await asyncio.wait_for(r.read(4096), 30) for r, _ in idle]
                for _, w in idle:
                    w.close()
                served = await client.post("/v1/completions", json=VICTIM)
            return closed, busy, served

        closed, busy, served = asyncio.run(asyncio.wait_for(run(), timeout=120))
        refused = metric(s.url, "specledger:connections_refused_total")
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "too_many_connections" and "--max-connections" in busy.text
    assert all(c.startswith(b"HTTP/1.1 408") for c in closed)
    assert served.status_code == 200 and refused >= 1


def test_the_default_cap_stays_below_the_descriptor_limit(monkeypatch):
    import resource

    for soft, want in [(256, (256 - RESERVED_FDS) // 2), (1024, 480), (20_000, 1024), (70, 3)]:
        monkeypatch.setattr(resource, "getrlimit", lambda _which, s=soft: (s, s))
        assert default_max_connections() == want and want < soft


def test_past_the_descriptor_limit_every_client_is_answered():
    """A real `specledger serve` allowed 256 open files (its cap by default (256 - 64) / 2 = 96): 400 silent
    connections, more than it may hold, then clients. Each is answered: 503 while the silent ones fill the cap, 200
    once they have timed out; the silent ones themselves 503 or 408. Without the cap the accepts fail (EMFILE) and
    every client waits unanswered."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.Popen([sys.executable, "-m", "specledger.cli", "serve", "--port", "0", "--read-timeout", "4",
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    silent: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 300
        url = None
        while url is None:  # the line `serve` prints once the model is loaded
            assert proc.poll() is None and time.monotonic() < deadline, said
            url = next((m.group(1) for line in list(said) if (m := re.search(r"on (http://127.0.0.1:\d+)/v1", line))),
                       None)
            time.sleep(0.05)
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, said
        port = int(url.rsplit(":", 1)[1])
        silent = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(400)]
        busy = [httpx.post(url + "/v1/completions", json=VICTIM, timeout=10) for _ in range(3)]
        answers = [s.recv(4096) for s in silent]  # (a 503 at once, or a 408 after the read timeout)
        served = httpx.post(url + "/v1/completions", json=VICTIM, timeout=60)
    finally:
        for s in silent:
            s.close()
        proc.terminate()
        proc.wait(60)
    assert [r.status_code for r in busy] == [503] * 3 and busy[0].json()["error"]["code"] == "too_many_connections"
    assert sum(a.startswith(b"HTTP/1.1 408") for a in answers) == 96, [a[:30] for a in answers]
    assert sum(a.startswith(b"HTTP/1.1 503") for a in answers) == 400 - 96
    assert served.status_code == 200
    log = "".join(said)
    assert "Traceback" not in log and "out of system resource" not in log, log[-3000:]

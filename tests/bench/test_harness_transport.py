"""Against servers that misbehave at the transport level (tests/support/fake_openai_server.py on 127.0.0.1):
a stale keep-alive connection is re-sent, never a failure; a dropped stream is a failure, counted and
priced as a failed attempt."""

from __future__ import annotations

import asyncio
import csv
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from specledger.bench.backends.make import make_backend
from specledger.bench.backends.openai_http import OpenAIBackend, transport_backoff_s
from specledger.records.config import BenchConfig, parse_run_config
from specledger.records.results import read_requests
from specledger.bench.runner import Runner
from specledger.bench.tables import render_run
from specledger.ledger.price import price_run
from specledger.report.terminal import render_cost_table, render_notes
from tests.support.fake_openai_server import FakeOpenAIServer, FakeSettings

IDLE = 0.2  # the server drops a request that arrives on a connection idle this long


@pytest.fixture(scope="module")
def stale_server():
    with FakeOpenAIServer(FakeSettings(idle_close_s=IDLE)) as srv:
        yield srv


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(FakeSettings()) as srv:
        yield srv


def backend(srv: FakeOpenAIServer, **openai) -> OpenAIBackend:
    bc = BenchConfig(name="x", backend="openai", model="fake-model", max_tokens=4,
                     openai={"base_url": srv.base_url, "connect_timeout_s": 2, "timeout_s": 10,
                             "scrape_metrics": False, **openai})
    return OpenAIBackend(bc)


def twice_with_a_pause(b: OpenAIBackend, pause: float):
    async def go():
        await b.start()
        try:
            first = await b.complete([{"role": "user", "content": "a"}], max_tokens=3)
            await asyncio.sleep(pause)
            second = await b.complete([{"role": "user", "content": "b"}], max_tokens=3)
            return first, second
        finally:
            await b.close()

    return asyncio.run(go())


def test_stale_connection_without_transport_retries_is_the_reported_failure(stale_server):
    before = stale_server.stats.idle_closed
    first, second = twice_with_a_pause(backend(stale_server, transport_retries=0, keepalive_expiry_s=30), IDLE + 0.15)
    assert first.ok
    assert not second.ok and second.error_kind == "disconnected"
    assert "Server disconnected without sending a response" in second.error
    assert stale_server.stats.idle_closed == before + 1


def test_stale_connection_is_sent_again_on_a_fresh_one(stale_server):
    before = stale_server.stats.idle_closed
    first, second = twice_with_a_pause(backend(stale_server, keepalive_expiry_s=30), IDLE + 0.15)
    assert first.ok and first.transport_retries == 0
    assert second.ok and second.attempts == 1 and second.output_tokens == 3
    assert second.transport_retries == 1
    assert "Server disconnected without sending a response" in second.transport_errors[0]
    assert stale_server.stats.idle_closed == before + 1


def test_keepalive_expiry_shorter_than_the_servers_idle_timeout_avoids_stale_connections(stale_server):
    before = stale_server.stats.idle_closed
    _, second = twice_with_a_pause(backend(stale_server, keepalive_expiry_s=IDLE / 4), IDLE + 0.15)
    assert second.ok and second.transport_retries == 0
    assert stale_server.stats.idle_closed == before  # the client let the idle connection go first


def test_refused_connection_is_retried_then_a_failure(server):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def go():
        b = backend(server, transport_retries=2)
        await b.start()
        b.replicas = [f"http://127.0.0.1:{port}"]  # the server went away after the run started
        b._pools.free = [[]]
        try:
            return await b.complete([{"role": "user", "content": "x"}], max_tokens=2)
        finally:
            await b.close()

    c = asyncio.run(go())
    assert not c.ok and c.error_kind == "connect" and c.attempts == 1
    assert c.transport_retries == 2 and len(c.transport_errors) == 2
    assert [transport_backoff_s(i) for i in (1, 2, 3)] == [0.0, 0.05, 0.2]


def write_workload(path: Path, n: int) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"question_id": i, "category": "qa", "turns": [f"question q{i}"],
                                "reference": "t001"}) + "\n")
    return str(path)


class PauseFirstOfEachLevel:
    """The real backend, pausing before the first request of each level (after a level's slowest
    phase, e.g. a long warm-up or a slow checkpoint), so the connection pooled by the previous level is stale."""

    def __init__(self, bc, per_level: int):
        self.inner, self.n, self.per_level = make_backend(bc), 0, per_level

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def complete(self, *a, **k):
        self.n += 1
        if self.n % self.per_level == 1:
            await asyncio.sleep(IDLE + 0.15)
        return await self.inner.complete(*a, **k)


def sweep(srv, tmp_path: Path, name: str, **openai):
    wl = write_workload(tmp_path / f"{name}.jsonl", 4)
    o = {"base_url": srv.base_url, "connect_timeout_s": 2, "timeout_s": 10, "keepalive_expiry_s": 30, **openai}
    cfg = parse_run_config({
        "configs": [{"name": "srv", "backend": "openai", "model": "fake-model", "max_tokens": 4, "openai": o}],
        "workload": {"spec": wl}, "load": {"concurrency": [1, 4], "warmup": 0}, "bootstrap": 0,
    })
    run = Runner(cfg, tmp_path / name, show_progress=False,
                 backend_factory=lambda bc: PauseFirstOfEachLevel(bc, per_level=4)).run()
    return run, read_requests(tmp_path / name)


def test_a_sweep_over_stale_connections_has_no_failures(stale_server, tmp_path):
    # first the failure the issue reports: the first request of the concurrency-4 level meets the stale
    # connection the concurrency-1 level left in the pool
    run, recs = sweep(stale_server, tmp_path, "before", transport_retries=0)
    failed = [r for r in recs if r.status == "failed"]
    assert len(failed) >= 1 and all(r.error_kind == "disconnected" for r in failed)
    assert {r.load for r in failed} <= {"c=1", "c=4"}
    cr = run.configs[0]
    assert not cr.comparable and "failures" in cr.comparable_reason  # >= 1 of 8 is above 5%

    run, recs = sweep(stale_server, tmp_path, "after")
    assert all(r.status == "ok" for r in recs) and len(recs) == 8
    c4 = [r for r in recs if r.load == "c=4"]
    assert sum(r.transport_retries for r in c4) >= 1  # recorded, not silent
    cr = run.configs[0]
    assert cr.comparable and not any(g.name == "failures" for g in cr.gates)
    lr = {x.load: x.aggregate for x in cr.loads}
    assert lr["c=4"].requests_failed == 0 and lr["c=4"].transport_retries >= 1
    assert lr["c=4"].transport_retries == sum(r.transport_retries for r in c4)
    rows = list(csv.DictReader((tmp_path / "after" / "summary.csv").read_text().splitlines()))
    assert [int(r["transport_retries"]) for r in rows] == [lr["c=1"].transport_retries, lr["c=4"].transport_retries]
    assert all(r["requests_failed"] == "0" and r["error_kinds"] == "" for r in rows)
    desc = run.conditions.backends["srv"]
    assert "keep-alive expiry 30 s" in desc and "transport retries 3" in desc
    assert run.conditions.config["configs"][0]["openai"]["keepalive_expiry_s"] == 30


def test_mid_stream_drops_are_counted_and_priced_as_failed_attempts(server, tmp_path):
    wl = write_workload(tmp_path / "w.jsonl", 6)
    o = {"base_url": server.base_url, "connect_timeout_s": 2, "timeout_s": 10}
    configs = [
        {"name": "clean", "backend": "openai", "strategy": "ar", "model": "fake-model", "max_tokens": 4,
         "openai": o},
        {"name": "droppy", "backend": "openai", "strategy": "lookup", "model": "fake-model", "max_tokens": 4,
         "openai": {**o, "extra_body": {"fake": {"drop_if": ["q3"], "drop_after_chunks": 1}}}},
    ]

    def measure(name: str, **gates):
        cfg = parse_run_config({"configs": configs, "workload": {"spec": wl}, "gates": gates,
                                "load": {"concurrency": [1], "warmup": 0}, "bootstrap": 0})
        return Runner(cfg, tmp_path / name, show_progress=False).run()

    run = measure("strict")
    recs = [r for r in read_requests(tmp_path / "strict") if r.config == "droppy"]
    (failed,) = [r for r in recs if r.status == "failed"]
    assert failed.question_id == "3" and failed.error_kind == "dropped" and failed.transport_retries == 0
    assert "mid-stream after 1 chunks" in failed.error
    droppy = run.config("droppy")
    assert droppy.loads[0].aggregate.errors == {"dropped": 1}
    assert droppy.pass_rate == pytest.approx(5 / 6)  # 5 graded answers pass; the failed request counts
    assert not droppy.comparable and "failures: 1/6 requests failed (16.7%: dropped 1)" in droppy.comparable_reason
    assert run.config("clean").comparable and run.config("clean").pass_rate == 1.0

    console = Console(width=250, record=True)
    console.print(render_run(run))
    assert "droppy c=1: 1/6 failed (dropped 1)" in console.export_text()
    rows = {r["config"]: r for r in csv.DictReader((tmp_path / "strict" / "summary.csv").read_text().splitlines())}
    assert rows["droppy"]["requests_failed"] == "1" and rows["droppy"]["error_kinds"] == "dropped=1"
    assert float(rows["droppy"]["failure_rate"]) == pytest.approx(1 / 6)

    ledger = price_run(tmp_path / "strict", samples=0)
    d, c = ledger.config("droppy"), ledger.config("clean")
    assert d.verdict == "not comparable" and "failures" in d.verdict_detail
    assert (d.failed, d.requests, d.errors) == (1, 6, {"dropped": 1})
    # no quality difference from clean shown: priced at clean's grades of the items it answered, its failure its own
    assert d.pass_rate == pytest.approx(5 / 6) and d.pass_rate_source.startswith("shared: clean's 5/6, 1 failed")
    console = Console(width=80, record=True)
    console.print(render_cost_table(ledger))
    assert "1/6 failed" in console.export_text()  # in the pass column of the 80-column table
    console.print(render_notes(ledger))
    assert "droppy: failed requests 1/6 (dropped 1)" in console.export_text()

    # allowed to fail more, it is compared, and failing still never makes it cheaper
    run = measure("lenient", max_failure_rate=0.5)
    assert run.config("droppy").comparable
    ledger = price_run(tmp_path / "lenient", samples=0)
    d, c = ledger.config("droppy"), ledger.config("clean")
    assert d.pass_rate == pytest.approx(5 / 6) and c.pass_rate == 1.0
    assert d.total > c.total and d.verdict != "cheapest"


def test_a_drop_after_the_response_started_is_a_failure_not_a_transport_retry(server, tmp_path):
    path = tmp_path / "w.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"question_id": 0, "category": "qa", "turns": ["one"], "reference": "t001"}) + "\n")
        f.write(json.dumps({"question_id": 1, "category": "qa", "turns": ["two"], "reference": "t001"}) + "\n")
    # "two": headers and the role chunk arrive, then the connection is cut before any content
    o = {"base_url": server.base_url, "connect_timeout_s": 2,
         "extra_body": {"fake": {"drop_if": ["two"], "drop_after_chunks": 0}}}
    cfg = parse_run_config({"configs": [{"name": "s", "backend": "openai", "model": "fake-model",
                                         "max_tokens": 4, "openai": o}],
                            "workload": {"spec": str(path)}, "load": {"warmup": 0}, "bootstrap": 0})
    run = Runner(cfg, tmp_path / "r", show_progress=False).run()
    failed = [r for r in read_requests(tmp_path / "r") if r.status == "failed"]
    assert [(r.question_id, r.error_kind, r.transport_retries) for r in failed] == [("1", "dropped", 0)]
    assert run.configs[0].pass_rate == 0.5
    gate = next(g for g in run.configs[0].gates if g.name == "pass_rate")
    assert gate.figures["passes"] == 1 and gate.figures["graded"] == 2


def test_uvicorn_closing_idle_connections_at_the_moment_requests_go_out(tmp_path):
    """A real server (uvicorn, keep-alive timeout 0.3 s) and requests paced at that timeout, so some meet a
    connection the server is closing just then (ReadError / "Server disconnected"): none fails."""
    import socket
    import threading

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "m"}]}

    @app.post("/v1/chat/completions")
    async def chat():
        async def events():
            yield 'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, timeout_keep_alive=0.3,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        b = OpenAIBackend(BenchConfig(name="u", backend="openai", model="m", openai={
            "base_url": f"http://127.0.0.1:{port}", "scrape_metrics": False, "keepalive_expiry_s": 30}))

        async def go():
            await b.start()
            out = []
            try:
                for _ in range(30):
                    out.append(await b.complete([{"role": "user", "content": "x"}], max_tokens=2))
                    await asyncio.sleep(0.299)
            finally:
                await b.close()
            return out

        done = asyncio.run(go())
    finally:
        server.should_exit = True
        thread.join(10)
    assert [c.error for c in done if not c.ok] == []
    assert all(c.text == "hi" for c in done)


def test_connections_that_failed_before_a_response_are_not_kept(stale_server):
    b = backend(stale_server, keepalive_expiry_s=30)

    async def go():
        await b.start()
        try:
            for _ in range(3):
                c = await b.complete([{"role": "user", "content": "a"}], max_tokens=2)
                assert c.ok
                await asyncio.sleep(IDLE + 0.1)
            return len(b._pools.all), c.transport_retries
        finally:
            await b.close()

    pools, retries = asyncio.run(go())
    assert retries == 1 and pools == 1  # one request in flight at a time: one pool, however many went stale


def test_template_tokens_are_known_only_with_a_chat_tokenizer():
    """A trace sizes whole prompts: the completions API sends the text raw (0); chat adds the server's template,
    measured where the backend has a tokenizer with one (the configured counting tokenizer), else unknown."""
    from specledger.bench.synthetic import template_overhead

    def make(**openai) -> OpenAIBackend:
        return OpenAIBackend(BenchConfig(name="t", backend="openai", model="m", openai=openai))

    assert make(api="completions").template_tokens() == 0
    chat = make()
    assert chat.template_tokens() is None
    try:
        from specledger.engine.registry import resolve_model
        from specledger.engine.tokenizer import Tokenizer

        chat._tokenizer = Tokenizer.from_gguf(resolve_model("smollm2-135m"), set())
    except Exception as exc:  # model package not installed
        pytest.skip(f"embedded tokenizer unavailable: {exc}")
    assert chat.template_tokens() == template_overhead(chat._tokenizer) > 0

"""`serve --strategy hier` when drafting breaks: a failure in a pass's draft planning runs that pass without drafts
(every request answered, the same text as without the failure, counted in /metrics), and a failure in one request's
drafting state fails that request alone with a 500 and one log line, no traceback."""

from __future__ import annotations

import asyncio
import logging

import httpx

from specledger.decoding.factory import make_strategy
from specledger.server.app import create_app
from tests.decoding.test_draft_failures import fail_on
from tests.server.test_server_hostile import server_logs
from tests.support.server_thread import ServerThread

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Water boils at"]


def metric(url: str, name: str) -> float:
    lines = httpx.get(url + "/metrics").text.splitlines()
    return float(next(line.split()[-1] for line in lines if line.startswith(name)))


def test_hier_server_survives_a_failed_plan_and_fails_one_request_in_one_line(smollm):
    strategy = make_strategy("hier", smollm, intermediate=smollm, drafter="lookup", lookup_tokens=3, min_chain=2,
                             max_chain=4, draft_length="fixed")
    app = create_app(smollm, strategy, max_batch=4)
    spec = app.state.server.worker.scheduler.spec

    async def ask(client: httpx.AsyncClient) -> list[httpx.Response]:
        body = {"max_tokens": 32, "temperature": 0, "ignore_eos": True}  # passes enough for the 3rd plan to come
        return await asyncio.gather(*(client.post("/v1/completions", json={"prompt": p, **body}) for p in PROMPTS))

    async def run(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            return await ask(client)

    with ServerThread(app) as s:
        proposals = fail_on(spec.drafter, "propose", {3})  # the third pass's planning
        accepts = fail_on(spec.drafter, "accept", {1})  # one request's drafting state, once
        with server_logs() as records:
            first = asyncio.run(asyncio.wait_for(run(s.url), timeout=240))
        assert proposals["calls"] > 3 and accepts["calls"] > 1
        again = asyncio.run(asyncio.wait_for(run(s.url), timeout=240))  # nothing injected any more
        assert [r.status_code for r in again] == [200] * 4
        failed = [r for r in first if r.status_code == 500]
        assert len(failed) == 1 and failed[0].json()["error"]["code"] == "internal_error"
        assert "injected failure in accept" in failed[0].json()["error"]["message"]
        for r, want in zip(first, again):  # the others: answered, the same text as without any failure
            if r.status_code != 500:
                assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.json()["choices"][0]["text"]
        assert metric(s.url, "specledger:draft_failures_total") == 1
        assert metric(s.url, 'specledger:requests_total{endpoint="/v1/completions",status="500"}') == 1
    records = list({id(r): r for r in records}.values())  # (a record reaches both the root and specledger's handler)
    said = [(r.levelno, r.getMessage()) for r in records]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records), said
    assert [m for lv, m in said if lv >= logging.ERROR and "injected failure in accept" in m] == [
        "generation failed: RuntimeError: injected failure in accept"], said
    assert sum("injected failure in propose" in m for _, m in said) == 1, said
    assert len(said) == 2, said

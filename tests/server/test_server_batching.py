"""`specledger serve` on the continuous-batching scheduler: many streaming clients at once, none lost,
and /metrics adding up to exactly what the clients received."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specledger.decoding.factory import make_strategy
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.server.app import create_app
from tests.support.server_thread import ServerThread

MODEL = "smollm2-135m"
N_CLIENTS = 64


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def one_stream(client: httpx.AsyncClient, i: int) -> dict:
    body = {"model": MODEL, "prompt": f"Count to {i % 7 + 2}: one, two,", "max_tokens": 2 + i % 4,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    text, usage, done, ext = "", None, False, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            ev = json.loads(data)
            assert "error" not in ev, ev
            if ev["choices"]:
                text += ev["choices"][0]["text"]
            if ev.get("usage"):
                usage, ext = ev["usage"], ev["specledger"]
    return {"i": i, "prompt": body["prompt"], "max": body["max_tokens"], "text": text, "usage": usage,
            "done": done, "ext": ext}


async def many(url: str) -> list[dict]:
    limits = httpx.Limits(max_connections=N_CLIENTS + 4, max_keepalive_connections=N_CLIENTS + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(one_stream(client, i) for i in range(N_CLIENTS)))


@pytest.fixture(scope="module")
def batch_server(smollm):
    with ServerThread(create_app(smollm, make_strategy("ar", target=smollm), max_queue=N_CLIENTS,
                                 max_batch=16, prefill_chunk=32)) as srv:
        yield srv


def test_64_concurrent_streams_none_lost_metrics_add_up(batch_server, smollm):
    url = batch_server.url
    before = scrape(url)
    results = asyncio.run(asyncio.wait_for(many(url), timeout=240))
    after = scrape(url)
    assert len(results) == N_CLIENTS
    assert all(r["done"] and r["usage"] is not None for r in results)
    assert all(r["usage"]["completion_tokens"] == r["max"] for r in results)  # ignore_eos: every token arrives

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("specledger:requests_total", endpoint="/v1/completions", status="200") == N_CLIENTS
    assert delta("specledger:prompt_tokens_total") == sum(r["usage"]["prompt_tokens"] for r in results)
    assert delta("specledger:generation_tokens_total") == sum(r["usage"]["completion_tokens"] for r in results)
    assert delta("specledger:e2e_request_latency_seconds_count") == N_CLIENTS
    # seven prompts among 64 clients: later ones find an earlier one's prompt in a freed slot
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results]
    assert sum(cached) > 0 and delta("specledger:prefix_cache_hits_total") == sum(cached)
    assert delta("specledger:prefix_cache_queries_total") == sum(r["usage"]["prompt_tokens"] for r in results)
    assert delta("specledger:time_to_first_token_seconds_count") == N_CLIENTS
    # they really ran together, and the gauges are back to idle
    assert max(r["ext"]["params"]["max_batch"] for r in results) == 16
    assert {r["ext"]["params"]["prefill_chunk"] for r in results} == {32}
    assert any(r["ext"]["queue_s"] > 0 for r in results)
    assert after[("specledger:num_requests_running", ())] == 0 and after[("specledger:num_requests_waiting", ())] == 0
    assert after[("specledger:batch_size", ())] == 0
    # a few streams checked against the same request run alone (greedy: identical text)
    reused = next(r for r, n in zip(results, cached) if n)
    for r in [*results[:3], reused]:
        alone = generate(make_strategy("ar", target=smollm), smollm.tokenizer.encode(r["prompt"]),
                         SamplingParams(max_tokens=r["max"], temperature=0.0, ignore_eos=True))
        assert r["text"] == alone.text


def test_batch_gauges_while_busy_and_disconnect_cancels(batch_server):
    url = batch_server.url
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    before = scrape(url)

    async def run() -> dict:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(3)]
            opened = [await s.__aenter__() for s in streams]
            lines = [r.aiter_lines() for r in opened]  # kept referenced: a collected iterator closes its stream
            for it in lines:  # each has produced its first token
                async for line in it:
                    if line.startswith("data:"):
                        break
            busy = scrape(url)
            for s in streams:  # every client goes away mid-stream
                await s.__aexit__(None, None, None)
            return busy

    busy = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert busy[("specledger:num_requests_running", ())] == 3
    assert busy[("specledger:batch_size", ())] == 3
    assert asyncio.run(_idle(url))
    after = scrape(url)
    got = after[("specledger:requests_total", (("endpoint", "/v1/completions"), ("status", "cancelled")))] - \
        before.get(("specledger:requests_total", (("endpoint", "/v1/completions"), ("status", "cancelled"))), 0)
    assert got == 3
    assert after[("specledger:generation_tokens_total", ())] - before[("specledger:generation_tokens_total", ())] < 600


async def _idle(url: str, timeout: float = 30.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    async with httpx.AsyncClient(base_url=url) as client:
        while loop.time() < end:
            h = (await client.get("/health")).json()
            if h["running"] == 0 and h["waiting"] == 0:
                return True
            await asyncio.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["eagle", "draft"])
def test_speculative_strategies_are_served_batched(smollm, strategy, monkeypatch):
    """EAGLE (the shipped head) and a draft chain from the W4A16 copy run on the scheduler too: concurrent
    greedy requests share passes and each gets autoregressive decoding's text (fp32: lossless in a batch).
    The planner is given a flat cost (drafting always pays): whether it pays on the measured surfaces depends
    on the host (on an AMX host the fp32 target's passes grow from 2 rows on, and the server drafted nothing)."""
    from specledger.decoding.drafters import model
    from specledger.decoding.sizing import policy
    from specledger.decoding.sizing.planner import CostSurface

    monkeypatch.setattr(policy, "cost_surface", lambda *a, **k: CostSurface((1,), (1.0,)))
    monkeypatch.setattr(model, "cost_surface", lambda *a, **k: CostSurface((1,), (0.0,)))  # the draft model's
    params = {"draft": {"model": "target", "quant": "int4", "dtype": "bf16"}} if strategy == "draft" else {}
    st = make_strategy(strategy, target=smollm, **params)
    prompts = ["Name three colours:", "The capital of France is", "def add(a, b):\n    return"]

    async def go(url: str) -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            async def one(p: str) -> dict:
                r = await client.post("/v1/completions", json={"model": MODEL, "prompt": p, "max_tokens": 16,
                                                                "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200, r.text
                return r.json()
            return await asyncio.gather(*(one(p) for p in prompts))

    with ServerThread(create_app(smollm, st, max_queue=4, max_batch=4)) as srv:
        bodies = asyncio.run(go(srv.url))
    accepted = 0
    for p, b in zip(prompts, bodies):
        want = generate(make_strategy("ar", target=smollm), smollm.tokenizer.encode(p),
                        SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
        assert b["choices"][0]["text"] == want.text
        [lv] = b["specledger"]["levels"]
        assert lv["name"] == strategy and b["specledger"]["params"]["draft_length"] == "adaptive"
        accepted += lv["accepted"]
    assert accepted > 0


@pytest.mark.slow
def test_max_batch_one_serves_one_request_at_a_time(smollm):
    """`--max-batch 1`: the one worker serves any strategy one request at a time: each request that waits is
    admitted only once the one before it has finished, and each gets the text it gets alone."""
    prompts = ["The capital of France is", "Name three colours:", "def add(a, b):\n    return"]

    async def go(url: str) -> tuple[dict, list[dict]]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            health = (await client.get("/health")).json()
            rs = await asyncio.gather(*(client.post("/v1/completions", json={
                "model": MODEL, "prompt": p, "max_tokens": 10, "temperature": 0, "ignore_eos": True}) for p in prompts))
            return health, [r.json() for r in rs]

    with ServerThread(create_app(smollm, make_strategy("lookup", target=smollm), max_batch=1)) as srv:
        health, bodies = asyncio.run(go(srv.url))
    assert health["max_batch"] == 1
    ext = sorted((b["specledger"] for b in bodies), key=lambda e: e["queue_s"])
    for before, after in zip(ext, ext[1:]):  # arrivals are ~simultaneous: a wait covers the service before it
        assert after["queue_s"] + 0.1 >= before["total_s"] - before["queue_s"] > 0.1
    sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    for p, b in zip(prompts, bodies):
        want = generate(make_strategy("ar", target=smollm), smollm.tokenizer.encode(p), sp)
        assert b["choices"][0]["text"] == want.text

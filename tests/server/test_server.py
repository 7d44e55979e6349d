"""`specledger serve` end to end: a real server on 127.0.0.1 with the embedded model, driven by the
official openai client and raw httpx (streaming and not, stops, errors, queue, disconnects, metrics)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specledger.bench.telemetry import telemetry_delta
from specledger.decoding.factory import make_strategy
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.engine import qkernel
from specledger.server.app import create_app
from tests.support.server_thread import ServerThread

MODEL = "smollm2-135m"
CHAT = [{"role": "user", "content": "List three colours of the rainbow."}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(smollm):
    """lookup strategy (batched: draft length planned per step), so the speculation counters have a level
    to move; one request may wait beyond the batch's free slots."""
    with ServerThread(create_app(smollm, make_strategy("lookup", target=smollm), max_queue=1)) as srv:
        yield srv


@pytest.fixture(scope="module")
def ar_server(smollm):
    """Autoregressive (steady ~10+ tok/s here, unlike lookup on repetitive text): for queueing tests.
    A batch of one, so a second request waits behind the first as before batching."""
    with ServerThread(create_app(smollm, make_strategy("ar", target=smollm), max_queue=1, max_batch=1)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def in_process(lm, ids: list[int], **sp) -> object:
    return generate(make_strategy("lookup", target=lm), ids, SamplingParams(temperature=0.0, **sp))


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def health(url: str) -> dict:
    return httpx.get(url + "/health").json()


def test_models_and_health(server):
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert health(server.url) == {"status": "ok", "model": MODEL, "strategy": "lookup", "running": 0,
                                  "waiting": 0, "max_queue": 1, "max_batch": 8, "prefill_chunk": 256,
                                  "prefix_cache": True, "kernel": qkernel.describe(), "weights": "smollm2-135m:fp32"}
    assert health(server.url)["kernel"].startswith(("specledger kernel, avx", "PyTorch's kernels ("))


@pytest.mark.kernel
@pytest.mark.skipif(qkernel.op() is None, reason="int8 activations are a precision of the engine's CPU kernel")
def test_health_names_the_served_precision_with_int8_activations():
    """`serve --quant int4 --activations 8`: /health says W4A8 was loaded, and it answers as in process."""
    from specledger.engine.loader import load_model

    lm = load_model("smollm2-135m", quant="int4", activations=8)
    with ServerThread(create_app(lm, make_strategy("ar", target=lm))) as srv:
        assert health(srv.url)["weights"] == "smollm2-135m:bf16-int4g32-a8"
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user",
                                                                           "content": "Name a colour."}]})
    assert r.json()["choices"][0]["message"]["content"] == in_process(
        lm, lm.tokenizer.chat([{"role": "user", "content": "Name a colour."}]), max_tokens=8).text


def test_a_trailing_assistant_message_is_continued(server, client, smollm):
    """A prefill (EvalPlus's response prefix; llama-server and vLLM do the same): the prompt ends inside the
    assistant's turn, with its words, not after an end of turn, and the answer is the continuation only."""
    start = "The three colours are"
    sent = [*CHAT, {"role": "assistant", "content": start}]
    ids, fresh = smollm.tokenizer.chat(sent), smollm.tokenizer.chat(CHAT)
    said = smollm.tokenizer.encode_text(start)
    assert ids[-len(said):] == said and ids[:len(fresh)] == fresh and len(ids) == len(fresh) + len(said)
    expected = in_process(smollm, ids, max_tokens=8)
    r = client.chat.completions.create(model=MODEL, messages=sent, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == expected.text and r.usage.prompt_tokens == len(ids)


def test_chat_greedy_equals_in_process_and_metrics_move(server, client, smollm):
    expected = in_process(smollm, smollm.tokenizer.chat(CHAT), max_tokens=12)
    before = scrape(server.url)
    before_text = httpx.get(server.url + "/metrics").text
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    after_text = httpx.get(server.url + "/metrics").text
    after = scrape(server.url)
    assert r.choices[0].message.content == expected.text
    assert r.choices[0].finish_reason == expected.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (expected.prompt_tokens, len(expected.token_ids))
    ext = r.model_extra["specledger"]
    # batched lookup plans its own draft lengths: the same text (lossless), its own steps and counts
    assert ext["strategy"] == "lookup" and 1 <= ext["steps"] <= r.usage.completion_tokens
    [lv] = ext["levels"]
    assert lv["name"] == "lookup" and lv["proposed"] >= lv["accepted"] >= 0 and lv["steps"] == ext["steps"]
    for key in ("tau", "ttft_s", "prefill_s", "draft_prefill_s", "queue_s"):
        assert key in ext

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("specledger:requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert delta("specledger:prompt_tokens_total") == r.usage.prompt_tokens
    assert delta("specledger:generation_tokens_total") == r.usage.completion_tokens
    assert delta("specledger:time_to_first_token_seconds_count") == 1
    assert delta("specledger:e2e_request_latency_seconds_count") == 1
    assert lv["drafts"] <= lv["steps"] and sum(lv["accepted_per_position"]) == lv["accepted"]
    assert delta("specledger:spec_decode_num_drafts_total", level="lookup") == lv["drafts"]
    for pos, n in enumerate(lv["accepted_per_position"]):
        assert delta("specledger:spec_decode_num_accepted_tokens_per_pos_total", level="lookup", position=str(pos)) == n
    assert delta("specledger:spec_decode_num_draft_tokens_total", level="lookup") == lv["proposed"]
    assert delta("specledger:spec_decode_num_accepted_tokens_total", level="lookup") == lv["accepted"]
    # the harness reads the same counters as it reads vLLM's
    info, levels = telemetry_delta(before_text, after_text)
    assert [(a.name, a.proposed, a.accepted) for a in levels if a.proposed] == \
        ([("lookup", lv["proposed"], lv["accepted"])] if lv["proposed"] else [])
    assert info["counters"]["specledger:generation_tokens_total"] == r.usage.completion_tokens
    assert info["server_rss_bytes"] > 0


def test_completion_stream_with_usage_adds_up(server, client, smollm):
    expected = in_process(smollm, smollm.tokenizer.encode(PROMPT), max_tokens=10)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected.text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [expected.finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len(expected.token_ids)
    assert last.usage.prompt_tokens == expected.prompt_tokens
    assert 1 <= last.model_extra["specledger"]["steps"] <= len(expected.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_without_usage_carries_extension_on_finish_chunk(server, client, smollm):
    expected = in_process(smollm, smollm.tokenizer.chat(CHAT), max_tokens=8)
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert chunks[-1].model_extra["specledger"]["levels"][0]["name"] == "lookup"


def test_stop_strings_end_the_text_and_never_leak(server, client, smollm):
    full = in_process(smollm, smollm.tokenizer.chat(CHAT), max_tokens=16).text
    stop = full[len(full) // 2: len(full) // 2 + 3]  # three characters in the middle, likely spanning tokens
    assert len(stop) == 3 and stop.strip()
    want = full[: full.find(stop)]
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stop=stop, stream=True)]
    assert "".join(pieces) == want
    assert stop not in "".join(pieces)


def error_of(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("path,body,param,code", [
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "temperature": 3}, "temperature", "invalid_value"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role",
     "invalid_value"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages", "invalid_value"),
    ("/v1/chat/completions", {"model": MODEL}, "messages", "missing_required_parameter"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "n": 2}, "n", "invalid_value"),
    ("/v1/completions", {"model": MODEL, "prompt": 5}, "prompt", "invalid_value"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens", "invalid_value"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}},
     "stream_options", "invalid_value"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 9000}, "max_tokens",
     "context_length_exceeded"),
    ("/v1/completions", {"model": MODEL, "prompt": [1] * 8192}, "prompt", "context_length_exceeded"),
    ("/v1/completions", {"model": MODEL, "prompt": [10 ** 6]}, "prompt", "invalid_value"),
])
def test_invalid_requests_answer_400_naming_the_field(server, path, body, param, code):
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error" and err["code"] == code
    assert err["param"] == param
    if param:
        assert param.split("[")[0] in err["message"] or "context length" in err["message"]


def test_malformed_json_unknown_model_and_client_errors(server, client):
    r = httpx.post(server.url + "/v1/completions", content=b"{bad", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in error_of(r)["message"]
    r = httpx.post(server.url + "/v1/completions", json={"model": "gpt-9", "prompt": "hi"})
    assert r.status_code == 404 and error_of(r)["param"] == "model"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=CHAT, top_p=0)
    assert exc.value.param == "top_p"


def test_queue_full_503_and_disconnect_frees_the_slot(ar_server):
    before = scrape(ar_server.url)
    long = {"model": MODEL, "prompt": PROMPT, "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
    short = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    queued: dict = {}
    a = httpx.Client(base_url=ar_server.url, timeout=60)
    with a.stream("POST", "/v1/completions", json=long) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept referenced: a dropped iterator closes the connection
        next(line for line in lines if line.startswith("data:"))  # A is generating
        tb = threading.Thread(target=lambda: queued.update(r=httpx.post(ar_server.url + "/v1/completions", json=short,
                                                                        timeout=60)))
        tb.start()
        wait_until(lambda: health(ar_server.url)["waiting"] == 1)  # B waits behind A
        c = httpx.post(ar_server.url + "/v1/completions", json=short)
        assert c.status_code == 503 and int(c.headers["retry-after"]) >= 1
        assert error_of(c)["code"] == "queue_full"
    a.close()  # A's client goes away mid-stream
    tb.join(60)
    assert queued["r"].status_code == 200 and queued["r"].json()["usage"]["completion_tokens"] == 4
    wait_until(lambda: health(ar_server.url)["running"] == 0)
    after = scrape(ar_server.url)
    ep = {"endpoint": "/v1/completions"}
    assert metric(after, "specledger:requests_total", **ep, status="cancelled") - \
        metric(before, "specledger:requests_total", **ep, status="cancelled") == 1
    assert metric(after, "specledger:requests_total", **ep, status="503") - \
        metric(before, "specledger:requests_total", **ep, status="503") == 1
    generated = metric(after, "specledger:generation_tokens_total") - metric(before, "specledger:generation_tokens_total")
    assert 4 < generated < 300 + 4  # A was stopped early, B ran to its end


def test_non_streaming_client_timeout_cancels_its_generation(ar_server):
    before = scrape(ar_server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(ar_server.url + "/v1/completions", timeout=1.5,
                   json={"model": MODEL, "prompt": PROMPT, "max_tokens": 300, "temperature": 0, "ignore_eos": True})
    wait_until(lambda: health(ar_server.url)["running"] == 0, timeout=15)
    after = scrape(ar_server.url)
    assert metric(after, "specledger:requests_total", endpoint="/v1/completions", status="cancelled") - \
        metric(before, "specledger:requests_total", endpoint="/v1/completions", status="cancelled") == 1
    assert metric(after, "specledger:generation_tokens_total") - metric(before, "specledger:generation_tokens_total") < 300


def test_internal_error_answers_500_and_the_server_keeps_serving(server, client):
    runner = server.server.app_state.worker.scheduler.runner  # the batched engine's passes
    real = runner.forward

    def boom(*args, **kwargs):
        raise RuntimeError("injected failure")

    runner.forward = boom
    try:
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 500
        err = error_of(r)
        assert err["type"] == "server_error" and "injected failure" in err["message"]
        with httpx.stream("POST", server.url + "/v1/completions",
                          json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": True}) as s:
            events = [line[5:].strip() for line in s.iter_lines() if line.startswith("data:")]
        assert events[-1] == "[DONE]" and "injected failure" in json.loads(events[-2])["error"]["message"]
    finally:
        runner.forward = real
    ok = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert ok.usage.completion_tokens == 4


def test_graceful_shutdown_finishes_in_flight_and_refuses_new(smollm):
    srv = ServerThread(create_app(smollm, make_strategy("ar", target=smollm), max_queue=4)).start()
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as s:
        lines = s.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        srv.server.handle_exit(signal.SIGTERM, None)  # what SIGTERM does
        try:
            refused = httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=10).status_code
        except httpx.TransportError:
            refused = "connection refused"
        assert refused in (503, "connection refused")
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]"
    final = json.loads(rest[-2][5:])
    assert final["choices"][0]["finish_reason"] == "length"
    srv.thread.join(30)
    assert not srv.thread.is_alive()


def test_exit_refuses_new_requests_at_once_while_the_in_flight_one_finishes(smollm):
    """Server.handle_exit drains the app before uvicorn even notices the exit (its loop looks every 0.1 s, then
    closes the socket): a request reaching the app in that moment is a 503 `shutting_down`, /health says
    draining, and the stream already running still ends normally."""
    app = create_app(smollm, make_strategy("ar", target=smollm), max_queue=4)
    srv = ServerThread(app).start()
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stream": True}

    async def new_requests() -> tuple[httpx.Response, httpx.Response]:
        """The same app, not through uvicorn's socket: so what answers is the app's own refusal, not a closed port."""
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as c:
            return await c.get("/health"), await c.post("/v1/completions", json={**body, "stream": False})

    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as s:
        lines = s.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        srv.server.handle_exit(signal.SIGTERM, None)  # what SIGTERM does
        health, new = asyncio.run(asyncio.wait_for(new_requests(), timeout=30))
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert new.status_code == 503 and error_of(new)["code"] == "shutting_down"
        assert new.headers["retry-after"] == "5"
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][5:])["choices"][0]["finish_reason"] == "length"
    srv.thread.join(30)
    assert not srv.thread.is_alive()


def test_cli_busy_port_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "specledger.cli", "serve", "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("error: cannot listen on 127.0.0.1:") and "Traceback" not in p.stderr

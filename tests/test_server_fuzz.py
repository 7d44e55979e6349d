"""Fuzzing the HTTP API against its own request models (issue 42): bodies drawn field by field from the pydantic
models' fields, each field present or not, with a plausible value, a value of a wrong type or any JSON at all,
plus unknown fields and bodies that are not objects. Whatever comes, the server answers 200 or a 4xx (never a
5xx, never a hang), a stream ends with [DONE], and its log holds no traceback. A small budget (examples with at
most 2 tokens to generate), so it runs in CI."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_server_hostile import server_logs

from specledger.decoding.factory import make_strategy
from specledger.server.app import ServerThread, create_app
from specledger.server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest

MODEL = "smollm2-135m"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
SHORT_TEXT = st.text(max_size=20)
# Limits never absent or null together: the answer stays 1 or 2 tokens (or the request is refused).
LIMIT = st.sampled_from([1, 2, 0, -1, "2", True, 2.5, 2**70, 10**6])

MESSAGE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "", None]),
    "content": SHORT_TEXT | st.none() | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]),
                                                                         "text": SHORT_TEXT}), max_size=2),
}
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL, "gpt-9", ""]),
    "max_tokens": LIMIT,
    "max_completion_tokens": LIMIT,
    "temperature": st.floats(-1, 3, allow_nan=False),
    "top_p": st.floats(-0.5, 1.5, allow_nan=False),
    "top_k": st.integers(-3, 100),
    "seed": st.integers(-(2**64), 2**65),
    "stop": st.none() | SHORT_TEXT | st.lists(SHORT_TEXT, max_size=6),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | ANY_JSON}),
    "min_tokens": st.integers(-2, 5),
    "ignore_eos": st.booleans(),
    "n": st.integers(0, 3),
    "logprobs": st.booleans() | st.none(),
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema"])}),
    "prompt": SHORT_TEXT | st.lists(st.integers(-5, 60_000), max_size=8) | st.lists(SHORT_TEXT, max_size=2),
}


def fields_of(model: type, plausible: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Any subset of the model's fields, each plausible or any JSON, plus maybe a field it does not have."""
    optional = {name: plausible.get(name, ANY_JSON) | ANY_JSON for name in model.model_fields}
    unknown = st.dictionaries(st.sampled_from(["max_token", "extra", "temperatur", "best_of_n"]), ANY_JSON,
                              max_size=1)
    return st.builds(lambda known, extra: {**known, **extra}, st.fixed_dictionaries({}, optional=optional), unknown)


MESSAGE = fields_of(ChatMessage, MESSAGE_FIELDS)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, Any]:
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    if draw(st.integers(0, 9)) == 0:  # not an object at all
        return path, draw(ANY_JSON)
    if path == CHAT:
        base = {"messages": draw(st.lists(MESSAGE, min_size=1, max_size=3) | ANY_JSON)}
        body = draw(fields_of(ChatCompletionRequest, {**PLAUSIBLE, "messages": st.just(base["messages"])}))
    else:
        body = draw(fields_of(CompletionRequest, PLAUSIBLE))
    body.setdefault("max_tokens", draw(st.sampled_from([1, 2])))  # no unbounded answers, no long ones
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 2 < v < 8192:
            body[key] = 2
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 1
    return path, body


@pytest.fixture(scope="module")
def fuzz_server(smollm):
    app = create_app(smollm, make_strategy("ar", target=smollm), max_queue=4, max_batch=4)
    with ServerThread(app) as s:
        yield s


@pytest.fixture(scope="module")
def logs():
    with server_logs() as records:
        yield records


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=requests())
def test_any_request_is_answered_200_or_4xx(fuzz_server, logs, req):
    path, body = req
    with httpx.Client(base_url=fuzz_server.url, timeout=30) as client:  # a hang fails as a timeout
        with client.stream("POST", path, content=json.dumps(body).encode(),
                           headers={"content-type": "application/json"}) as r:
            r.read()
    event(f"HTTP {r.status_code}")
    assert r.status_code in (200, 400, 404), (r.status_code, r.text[:300], body)
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["message"] and err["type"] == ("not_found_error" if r.status_code == 404 else
                                                  "invalid_request_error")
    elif r.headers["content-type"].startswith("text/event-stream"):
        events = [x[5:].strip() for x in r.text.splitlines() if x.startswith("data:")]
        assert events[-1] == "[DONE]" and not any(e.startswith('{"error"') for e in events), events[-3:]
    else:
        assert r.json()["usage"]["completion_tokens"] <= 2
    assert [x.getMessage() for x in logs if x.exc_info or x.levelno >= logging.ERROR] == []

"""Large legal bodies against `specledger serve` (issue 56): parsed, validated and tokenized off the event loop, one
large body at a time, so /health stays quick and a small request beside them is answered; a prompt longer than the
context can hold whatever its tokens is refused before it is tokenized (engine/prompt_bound.py)."""

from __future__ import annotations

import gc
import json
import sys
import threading
import time

import httpx
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specledger.decoding.factory import make_strategy
from specledger.server.app import MAX_BODY_BYTES, MAX_PROMPT_CHARS, create_app
from specledger.engine.prompt_bound import FOLD, text_bound
from tests.server.test_server_hostile import error_of, health_meanwhile, server_logs, tracebacks
from tests.support.server_thread import ServerThread

MODEL = "smollm2-135m"
EMOJI = "\U0001f600"


@pytest.fixture(scope="module")
def srv(smollm):
    """The default limits (4 MiB bodies, 1M-character prompts)."""
    app = create_app(smollm, make_strategy("ar", target=smollm), max_queue=16, max_batch=4)
    with ServerThread(app) as s:
        yield s


def emoji_body(n: int = 970_000) -> bytes:
    """A completion of n emoji, UTF-8 as it is (3.9 MB for 970k: under --max-body-bytes and --max-prompt-chars)."""
    return json.dumps({"model": MODEL, "prompt": EMOJI * n, "max_tokens": 1}, ensure_ascii=False).encode()


def messages_body(n: int = 100_000) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * n,
                       "max_tokens": 1}).encode()


# ---- the prompt bound -------------------------------------------------------------------------------


def test_the_bound_holds_for_the_models_tokenizer(smollm):
    """No text of more units than tokens x per_token: the longest entry itself, repeated; runs a BPE merges far;
    emoji, CJK, special tokens' text."""
    tok = smollm.tokenizer
    bound = text_bound(tok.hf)
    assert bound is not None and bound.in_bytes  # SmolLM2: byte-level BPE, no normalizer
    longest = max(tok.hf.get_vocab(), key=len)
    spelled = tok.hf.convert_tokens_to_string([longest])
    texts = [spelled * 50, " " * 5000, "\n" + " " * 4000, EMOJI * 3000, "漢字" * 2000, "a" * 9000,
             "<|im_start|>" * 300, "The quick brown fox. " * 300, "".join(chr(c) for c in range(32, 3000))]
    for text in texts:
        n = len(tok.encode(text))
        assert n * bound.per_token >= bound.size(text), (text[:20], n, bound)
    assert bound.per_token == len(longest)  # the tightest bound this rule gives: one entry, spelled in bytes


def fast(model, normalizer=None, pre=None) -> PreTrainedTokenizerFast:
    t = Tokenizer(model)
    if normalizer is not None:
        t.normalizer = normalizer
    if pre is not None:
        t.pre_tokenizer = pre
    return PreTrainedTokenizerFast(tokenizer_object=t)


VOCAB = {"a": 0, "b": 1, "ab": 2, "abab": 3, "[UNK]": 4}


@pytest.mark.parametrize("make,per_token,in_bytes", [
    (lambda: fast(models.BPE(VOCAB, [("a", "b"), ("ab", "ab")])), 5, False),  # the longest entry: "[UNK]"
    (lambda: fast(models.BPE(VOCAB, [], unk_token="[UNK]")), 5, False),  # one unknown character: one token
    (lambda: fast(models.BPE(VOCAB, []), pre=pre_tokenizers.ByteLevel()), 5, True),
    (lambda: fast(models.BPE(VOCAB, []), normalizers.NFKC()), 5 * FOLD, False),
    (lambda: fast(models.BPE(VOCAB, []), normalizers.Sequence([normalizers.Prepend("_"),
                                                                normalizers.Replace("abc", "x")])), 15, False),
    (lambda: fast(models.BPE(VOCAB, [], unk_token="[UNK]", fuse_unk=True)), None, None),  # a run of unknowns: 1
    (lambda: fast(models.BPE(VOCAB, []), normalizers.Strip()), None, None),  # deletes text
    (lambda: fast(models.BPE(VOCAB, []), normalizers.Replace("a", "")), None, None),
    (lambda: fast(models.BPE(VOCAB, []), normalizers.BertNormalizer()), None, None),
    (lambda: fast(models.BPE(VOCAB, []), pre=pre_tokenizers.Whitespace()), None, None),
    (lambda: fast(models.WordLevel(VOCAB, unk_token="[UNK]")), None, None),
])
def test_bound_of_each_kind_of_tokenizer(make, per_token, in_bytes):
    bound = text_bound(make())
    if per_token is None:
        assert bound is None
    else:
        assert bound is not None and (bound.per_token, bound.in_bytes) == (per_token, in_bytes)


def test_a_prompt_past_the_bound_is_refused_before_tokenizing(srv, smollm):
    """970k emoji (3.9 MB, within both limits) took 15 s of tokenizing to be refused: now at once, the tokenizer
    never called; a prompt of the same characters within the bound is still tokenized and served."""
    tok = smollm.tokenizer
    calls = []
    real = tok.encode

    def counted(text: str) -> list[int]:
        calls.append(len(text))
        return real(text)

    tok.encode = counted
    try:
        t0 = time.perf_counter()
        r = httpx.post(srv.url + "/v1/completions", content=emoji_body(), timeout=120,
                       headers={"content-type": "application/json"})
        took = time.perf_counter() - t0
        assert r.status_code == 400, r.text
        err = error_of(r)
        assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
        assert "3880000 bytes of UTF-8" in err["message"] and "8191 tokens" in err["message"]
        assert calls == []  # refused on its size alone
        assert took < 5.0  # (measured well under a second; the tokenizer took 15 s)
        victim = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": EMOJI * 3, "max_tokens": 2},
                            timeout=120)
        assert victim.status_code == 200 and calls == [3]
    finally:
        del tok.encode  # (the instance attribute: the method is back)


# ---- eight maximal bodies at once -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["100k messages", "970k emoji"])
def test_eight_maximal_bodies_at_once_leave_health_and_a_small_request_quick(srv, kind):
    body = messages_body() if kind == "100k messages" else emoji_body()
    assert len(body) <= MAX_BODY_BYTES and len(body.decode()) < 4 * MAX_PROMPT_CHARS  # legal: within both limits
    assert kind != "970k emoji" or len(json.loads(body)["prompt"]) < MAX_PROMPT_CHARS
    path = "/v1/chat/completions" if kind == "100k messages" else "/v1/completions"
    switch = sys.getswitchinterval()
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(httpx.post(srv.url + path, content=body, headers={"content-type": "application/json"},
                                  timeout=300))

    with server_logs() as records, health_meanwhile(srv.url) as lat:
        senders = [threading.Thread(target=send) for _ in range(8)]
        for t in senders:
            t.start()
        t0 = time.perf_counter()
        victim = httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 2, "ignore_eos": True})
        victim_s = time.perf_counter() - t0
        for t in senders:
            t.join(300)
        flood_s = time.perf_counter() - t0
    print(f"\n8 x {kind} ({len(body) / 2**20:.1f} MiB each): all answered in {flood_s:.1f} s; a small request "
          f"beside them {victim_s * 1000:.0f} ms; /health: {len(lat)} polls, max {max(lat) * 1000:.0f} ms")
    assert victim.status_code == 200 and victim.json()["usage"]["completion_tokens"] == 2
    # each refused before tokenizing: the emoji on their size, the conversation once its template has wrapped it
    assert len(answers) == 8 and all(a.status_code == 400 and error_of(a)["code"] == "context_length_exceeded"
                                     and "tokens can hold" in error_of(a)["message"] for a in answers), \
        [a.text[:300] for a in answers]
    # A busy 2-core machine (load 12), the clients in the server's process: /health's max was 0.2-0.4 s and the small
    # request took 2-6 s (its 2 tokens sharing the cores); parsing on the event loop held both for the whole flood
    assert max(lat) < 1.5 and victim_s < 15.0
    assert tracebacks(records) == []
    assert gc.isenabled() and sys.getswitchinterval() == switch  # (the server runs in this process) as they were

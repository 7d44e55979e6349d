"""The in-process backend refuses a prompt the context cannot hold whatever its tokens before tokenizing it (a
50 MB workload line was tokenized whole, 145 s and 8.9 GB, to be refused after; issue 56)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from specledger.bench.backends.inprocess import InProcessBackend
from specledger.records.config import parse_run_config


class Tokenized(Exception):
    """The prompt reached the tokenizer."""


def _backend(ctx: int) -> InProcessBackend:
    from specledger.engine.registry import resolve_model
    from specledger.engine.tokenizer import Tokenizer

    try:
        tok = Tokenizer.from_gguf(resolve_model("smollm2-135m"), set())
    except Exception as exc:  # model package not installed
        pytest.skip(f"embedded tokenizer unavailable: {exc}")

    def chat(messages):
        raise Tokenized

    lm = SimpleNamespace(tokenizer=SimpleNamespace(hf=tok.hf, chat=chat), config=SimpleNamespace(max_seq_len=ctx))
    config = parse_run_config({"configs": [{"name": "a"}]}).configs[0]
    return InProcessBackend(config, models={"target": lm})


def test_a_prompt_no_context_can_hold_is_refused_untokenized():
    backend = _backend(ctx=2048)
    bound = backend._cannot_fit(backend.models["target"], [])  # (reads the bound)
    assert bound is None and backend._bound is not None
    most = backend._bound.per_token * 2047
    c = asyncio.run(backend.complete([{"role": "user", "content": "x" * (most + 1)}], max_tokens=4))
    assert not c.ok and c.error_kind == "rejected" and "refused before tokenizing it" in (c.error or "")
    with pytest.raises(Tokenized):  # one that may fit goes on to the tokenizer
        asyncio.run(backend.complete([{"role": "user", "content": "x" * most}], max_tokens=4))

"""A bf16 model's KV cache in bf16 on CPUs that compute in bf16 (cpu_ops.Ops.kv_dtype, bf16_cache): the fused
attention reads it as fp32, so every path gives what the fp32 cache of the same values gives."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.conftest import tiny_model
from specledger.decoding.loop.runner import RunItem, ModelRunner
from specledger.decoding.tree import Tree
from specledger.engine import cpu_ops
from specledger.engine.model import ragged_hidden
from specledger.engine.ragged import Segment


@pytest.fixture
def bf16_host() -> cpu_ops.Ops:
    ops = cpu_ops.resolve("cpu")
    if not ops.bf16_cache:
        pytest.skip("this host does not compute in bf16, or the fused kernels are not loaded")
    return ops


def test_rows_attention_reads_a_bf16_cache_as_the_fp32_one(bf16_host):
    """The kernel on a bf16 cache against the same values in fp32: decode rows of different lengths, one of them
    under a tree's allow mask, each on its own slot."""
    torch.manual_seed(0)
    r, h, kv, s, d = 3, 6, 2, 40, 16
    q = torch.randn(r, h, d)
    k, v = (torch.randn(4, kv, s, d).bfloat16() for _ in range(2))
    slots, lengths = torch.tensor([2, 0, 3]), torch.tensor([40, 7, 23])
    allow = torch.ones(r, s, dtype=torch.bool)
    allow[2, 5:9] = False
    got = bf16_host.rows_attention(q, k, v, slots, lengths, allow)
    want = bf16_host.rows_attention(q, k.float(), v.float(), slots, lengths, allow)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)
    # and against attention written out, for one row
    kk = k[3, :, :23].float().repeat_interleave(h // kv, 0)
    vv = v[3, :, :23].float().repeat_interleave(h // kv, 0)
    sc = (q[2][:, None] @ kk.transpose(-1, -2))[:, 0] / d**0.5
    sc[:, 5:9] = float("-inf")
    ref = (torch.softmax(sc, -1)[:, None] @ vv)[:, 0]
    torch.testing.assert_close(got[2].float(), ref, atol=1e-2, rtol=1e-2)


def _decode(lm, steps: int = 8):
    """Prefill, decode steps one token at a time (the fused one-token path), then a chain verified under a mask (a
    masked segment), on a one-slot cache; and a ragged pass of decode rows on three slots."""
    m = lm.model
    ids = torch.tensor([[(5 * j + 1) % 64 for j in range(20)]])
    out = []
    with torch.inference_mode():
        cache = m.new_cache(64)
        logits = m(ids, cache)
        out.append(logits[0, -1])
        t = logits[:, -1:].argmax(-1)
        for _ in range(steps):
            logits = m(t, cache)
            out.append(logits[0, -1])
            t = logits.argmax(-1)
        n = cache.lengths[0]
        mask = torch.zeros(4, n + 4, dtype=torch.bool)
        mask[:, :n] = True
        mask[:, n:] = torch.ones(4, 4, dtype=torch.bool).tril()
        h = ragged_hidden(m, torch.tensor([int(t), 3, 9, 27]), torch.arange(n, n + 4), [Segment(0, 4, mask)], cache)
        out.append(m.logits(h))
        runner = ModelRunner(lm, 3, 64)
        seqs = [runner.open([(j * (i + 2)) % 64 for j in range(9 + 5 * i)]) for i in range(3)]
        runner.forward([RunItem(s) for s in seqs])
        for s in seqs:
            s.tokens.append(7)
        res = runner.forward([RunItem(s, Tree()) for s in seqs])
        out.extend(r.logits[0] for r in res)
    return cache.k.dtype, runner.cache.k.dtype, out


def test_bf16_cache_decodes_as_the_fp32_cache(bf16_host):
    lm = tiny_model(seed=4, dtype="bf16")
    assert lm.model.ops.bf16_cache  # the table it loads with
    k16, r16, got = _decode(lm)
    lm.model.use_ops(replace(bf16_host, bf16_cache=False))
    k32, r32, want = _decode(lm)
    assert (k32, r32, k16, r16) == (torch.float32, torch.float32, torch.bfloat16, torch.bfloat16)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
        assert a.argmax() == b.argmax()


def test_fp32_models_keep_an_fp32_cache():
    lm = tiny_model(seed=4)
    assert lm.model.new_cache(8).k.dtype == torch.float32

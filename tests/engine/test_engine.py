"""The engine on a tiny random model: cache rollback, chunked and tree forwards, quantized linears."""

from dataclasses import replace

import pytest
import torch

from tests.conftest import tiny_config, tiny_model, tiny_tensors
from tests.support.varied_model import untied_tiny_model
from specledger.decoding.loop.runner import RunItem, ModelRunner
from specledger.decoding.tree import Tree
from specledger.engine import cpu_ops
from specledger.engine.linear import LinearProduct
from specledger.engine.loader import build_model
from specledger.engine.quant import Int4Linear, Int8Linear, int4_grid, int8_grid
from specledger.errors import BadInput


def test_chunked_forward_matches_full_and_rollback():
    lm = tiny_model()
    m = lm.model
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    full = m(ids, m.new_cache(32))
    cache = m.new_cache(32)
    a = m(ids[:, :12], cache)
    b = m(ids[:, 12:], cache)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-4, rtol=1e-4)
    cache.rollback(0, 12)  # O(1) rollback, then recompute the same tail
    torch.testing.assert_close(m(ids[:, 12:], cache), b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cache.rollback(0, 40)


@pytest.mark.parametrize("start", [0, 7])
@pytest.mark.parametrize("bf16_path", [False, True])
@pytest.mark.parametrize("n", [cpu_ops.LONG_RUN + 4, cpu_ops.SPLIT_RUN])
def test_causal_attention_sees_the_cache_and_the_run_up_to_itself(start, bf16_path, n):
    """A prompt's chunk (more than LONG_RUN rows; from SPLIT_RUN on, after a cache, split in two calls merged by
    log-sum-exp) after `start` cached entries, in either of its paths (fp32 over the fp32 cache, or bf16 where the
    CPU computes in bf16), against softmax attention written out."""
    ops = replace(cpu_ops.resolve("cpu"), bf16_attention=bf16_path)
    torch.manual_seed(3)
    h, kv, d = 6, 2, 16
    q = torch.randn(1, h, n, d).bfloat16()
    keys, values = (torch.randn(1, kv, start + n, d).bfloat16().float() for _ in range(2))  # as a bf16 model's cache
    y = ops.causal_attention(q, keys, values, start, torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (1, h, n, d)
    k, v = keys.repeat_interleave(h // kv, 1), values.repeat_interleave(h // kv, 1)
    scores = q.float() @ k.transpose(-1, -2) / d**0.5
    sees = torch.arange(start + n)[None, :] <= torch.arange(n)[:, None] + start
    ref = torch.softmax(scores.masked_fill(~sees, float("-inf")), -1) @ v
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)


def test_cache_writes_land_in_the_cache_after_growing():
    """Writes go through per-layer, per-slot views; growing the cache must rebuild them (not write to a stale copy)."""
    from specledger.engine.slot_cache import SlotCache

    c = SlotCache(2, 1, 4, 3, 16, initial_len=2)
    c.write(1, 0, 0, torch.ones(1, 2, 4), torch.full((1, 2, 4), 2.0))
    c.reserve(3)
    k, v = c.write(1, 2, 2, torch.full((1, 1, 4), 5.0), torch.full((1, 1, 4), 6.0))
    assert c.capacity >= 3 and k.shape == (1, 3, 4)
    assert c.k[1, 2, 0, 2].eq(5).all() and c.v[1, 0, 0, :2].eq(2).all() and c.k[0].eq(0).all()


def test_a_cache_takes_another_caches_entries_into_one_slot():
    """take(): entries [start, end) of another cache's slot, converted to this cache's dtype, land in this slot alone
    (growing it first), and the slot then holds `end`; what it held before `start` stays; other shapes are refused."""
    from specledger.engine.slot_cache import SlotCache

    src = SlotCache(2, 2, 4, 2, 64, initial_len=8)
    src.alloc(), src.alloc()
    src.k.normal_(), src.v.normal_()
    src.lengths[1] = 8
    dst = SlotCache(2, 2, 4, 3, 64, dtype=torch.bfloat16, initial_len=2)
    dst.alloc(), dst.alloc()
    dst.k[:, 1, :, :1] = 7.0
    dst.lengths[1] = 1
    dst.take(src, 1, 1, 1, 6)
    assert dst.lengths == [0, 6, 0] and dst.capacity >= 6
    assert torch.equal(dst.k[:, 1, :, 1:6], src.k[:, 1, :, 1:6].bfloat16())
    assert torch.equal(dst.v[:, 1, :, 1:6], src.v[:, 1, :, 1:6].bfloat16())
    assert dst.k[:, 1, :, 0].eq(7).all() and dst.k[:, 0].eq(0).all() and dst.k[:, 2].eq(0).all()
    with pytest.raises(ValueError, match="cannot take"):
        dst.take(src, 1, 1, 0, 9)  # beyond what the source slot holds
    with pytest.raises(ValueError, match="cannot fill"):
        SlotCache(2, 1, 4, 1, 64).take(src, 1, 0, 0, 4)  # other KV heads


def test_tree_forward_equals_each_path_run_alone():
    lm = tiny_model()
    prefix = [3, 7, 9, 11]
    tree = Tree(tokens=[5, 6, 8, 2, 4], parents=[-1, -1, 0, 0, 1])  # root -> {5 -> {8, 2}, 6 -> {4}}
    r = ModelRunner(lm, 1)
    q = r.open(prefix)
    r.forward([RunItem(q, max_run=len(prefix) - 1)])
    [fwd] = r.forward([RunItem(q, tree)])
    for node, path in {2: [5, 8], 3: [5, 2], 4: [6, 4]}.items():
        m = lm.model
        ref = m(torch.tensor([prefix + path]), m.new_cache(32))[0, -1]
        torch.testing.assert_close(fwd.logits[node + 1], ref, atol=1e-4, rtol=1e-4)
    # keep the path 6 -> 4: the cache must then equal a plain run of prefix + [6, 4]
    feats = r.accept(q, fwd, [1, 4], [6, 4, 1])
    assert r.cached(q) == len(prefix) + 2 and feats.shape[0] == 3
    [nxt] = r.forward([RunItem(q)])
    ref = lm.model(torch.tensor([prefix + [6, 4, 1]]), lm.model.new_cache(32))[0, -1]
    torch.testing.assert_close(nxt.logits[-1], ref, atol=1e-4, rtol=1e-4)


def test_runner_sync_keeps_common_prefix():
    lm = tiny_model()
    r = ModelRunner(lm, 1)
    q = r.open([1, 2, 3, 4, 5, 6])
    r.forward([RunItem(q, max_run=5)])
    r.sync(q, [1, 2, 3, 9, 10])
    assert r.cached(q) == 3 and q.tokens == [1, 2, 3, 9, 10]
    [out] = r.forward([RunItem(q)])
    ref = lm.model(torch.tensor([[1, 2, 3, 9, 10]]), lm.model.new_cache(16))[0, -1]
    torch.testing.assert_close(out.logits[-1], ref, atol=1e-4, rtol=1e-4)


def test_int8_and_int4_linears_match_their_grids():
    """Whichever backend serves them (the engine's kernel, or PyTorch's where it is absent): tests/engine/test_qkernel.py
    checks each one exactly; here, the module as the loader builds it."""
    torch.manual_seed(0)
    w = torch.randn(96, 128)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    q8 = Int8Linear(w, torch.bfloat16)
    ref8 = x.float() @ int8_grid(w).dequantize().t()
    torch.testing.assert_close(q8(x).float(), ref8, atol=0.15, rtol=0.02)
    assert q8.weight.dtype == torch.int8
    grid = int4_grid(w, 32)
    q4 = Int4Linear(grid, torch.bfloat16, torch.device("cpu"))
    deq = ((grid.codes.float() - 8).reshape(96, 4, 32) * grid.scale[..., None] + grid.zero[..., None]).reshape(96, 128)
    torch.testing.assert_close(q4(x).float(), x.float() @ deq.t(), atol=0.3, rtol=0.03)
    assert q4.weight.numel() * q4.weight.element_size() == 96 * 128 // 2  # real packed bytes


@pytest.mark.parametrize("dtype,quant", [("fp32", "none"), ("bf16", "none"), ("bf16", "int8"), ("fp32", "int4")])
def test_every_product_of_a_layer_keeps_the_linear_contract(dtype, quant):
    """Whichever backend the loader put in a layer (dense, packed, int8, int4), its four products are a
    LinearProduct (engine/linear.py): what the layer and the fused decode layer call on them exists."""
    lm = tiny_model(dtype=dtype, quant=quant, hidden=128)
    for block in lm.model.layers:
        a, f = block.attention, block.feed_forward
        for m in (a.wqkv, a.wo, f.w13, f.w2):
            assert isinstance(m, LinearProduct), type(m).__name__
            assert m.kernel_layout() is None or len(m.kernel_layout()) == 4


def test_quantized_model_is_smaller_and_close():
    """On an untied model (a tied one predicts its input token whatever its weights): the quantized copies agree
    with fp32 far above chance, and a different model of the same shape, checked the same way, does not."""
    kw = dict(hidden=128, heads=4, kv_heads=2)
    fp = untied_tiny_model(**kw)
    q4 = untied_tiny_model(quant="int4", dtype="bf16", **kw)
    q8 = untied_tiny_model(quant="int8", dtype="bf16", **kw)
    # 64 x 128 embedding and output, a final norm, 2 layers of q/o 128x128, k/v 64x128, gate/up/down 256x128, 2 norms
    assert fp.weight_bytes == 4 * (2 * 64 * 128 + 128 + 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 256 * 128 + 2 * 128))
    assert q4.weight_bytes < q8.weight_bytes < fp.weight_bytes / 3
    ids = torch.randint(0, 64, (1, 64), generator=torch.Generator().manual_seed(2))
    ref = fp.model(ids, fp.model.new_cache(64))

    def closeness(lm):
        out = lm.model(ids, lm.model.new_cache(64))
        return (out.argmax(-1) == ref.argmax(-1)).float().mean(), (out - ref).norm() / ref.norm()

    for lm, min_agree, max_err in ((q8, 0.9, 0.05), (q4, 0.8, 0.25)):
        agree, err = closeness(lm)
        assert agree >= min_agree and err <= max_err, (lm.quant, agree, err)
    agree, err = closeness(untied_tiny_model(seed=9, **kw))  # negative control
    assert agree < 0.2 and err > 1.0


def test_bad_group_size_and_quant_are_clear_errors():
    cfg = tiny_config(hidden=96, heads=4, kv_heads=2)
    with pytest.raises(BadInput, match="group size 64 does not divide the input width 96"):
        build_model(cfg, tiny_tensors(cfg), quant="int4", group_size=64)
    with pytest.raises(BadInput, match="group size 48 is not supported"):
        build_model(cfg, tiny_tensors(cfg), quant="int4", group_size=48)
    with pytest.raises(BadInput, match="unknown quantization"):
        build_model(cfg, tiny_tensors(cfg), quant="int3")
    with pytest.raises(BadInput, match="unknown dtype"):
        build_model(cfg, tiny_tensors(cfg), dtype="fp8")


def test_context_overflow_is_a_clear_error():
    lm = tiny_model()
    from specledger.decoding.factory import make_strategy
    from specledger.decoding.loop.generate import generate

    with pytest.raises(BadInput, match="does not fit the context of 256"):
        generate(make_strategy("ar", lm), [1] * 300)
    with pytest.raises(BadInput, match="empty prompt"):
        generate(make_strategy("ar", lm), [])

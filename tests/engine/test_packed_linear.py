"""bf16 products on oneDNN-packed weights (engine/packed_linear.py): the same model, the same numbers."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_config, tiny_tensors
from specledger.engine.loader import build_model, weight_bytes
from specledger.engine.model import Linear
from specledger.engine.packed_linear import KernelLinear, PackedLinear, pack

PACKED = (PackedLinear, KernelLinear)


def _pair(**cfg_kw):
    cfg = tiny_config(vocab=96, hidden=64, **cfg_kw)
    t = tiny_tensors(cfg, seed=5)
    packed = build_model(cfg, t, dtype="bf16")
    if pack(Linear(16, 16, bias=False, dtype=torch.bfloat16)) is None:
        pytest.skip("this host has neither oneDNN's bf16 packing nor the engine's kernel")
    return build_model(cfg, t, dtype="bf16", pack=False), packed


def test_packed_model_computes_what_the_plain_one_does():
    """Every Linear of a CPU bf16 model is packed at load, and the logits stay those of F.linear: prefill, and
    decode step by step with greedy choices (a wrong layout, a transposed square weight, shows at once)."""
    dense, packed = _pair()
    n = sum(isinstance(m, PACKED) for m in packed.modules())
    assert n == 4 * packed.cfg.n_layers + 1 and not any(isinstance(m, PACKED) for m in dense.modules())
    assert weight_bytes(packed) == weight_bytes(dense)
    ids = torch.tensor([[(7 * j + 3) % 96 for j in range(24)]])
    with torch.inference_mode():
        cd, cp = dense.new_cache(64), packed.new_cache(64)
        a, b = dense(ids, cd), packed(ids, cp)
        torch.testing.assert_close(b, a, atol=3e-2, rtol=3e-2)
        t = a[:, -1:].argmax(-1)
        for _ in range(8):
            a, b = dense(t, cd), packed(t, cp)
            torch.testing.assert_close(b, a, atol=1e-2, rtol=1e-2)
            t = a.argmax(-1)


def test_packed_linear_gradient_is_the_dense_one():
    """The packed op has no backward: where a gradient is needed (EAGLE training through the frozen LM head) the
    layer computes on the dense matrix, so the gradient is right."""
    dense, packed = _pair()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (dense.output(xa).float() ** 2).sum().backward()
    (packed.output(xb).float() ** 2).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, atol=5e-2, rtol=2e-2)


def test_only_cpu_bf16_linears_are_packed():
    assert pack(Linear(8, 8, bias=False)) is None  # fp32
    assert pack(Linear(8, 8, bias=True, dtype=torch.bfloat16)) is None
    cfg = tiny_config()
    m = build_model(cfg, tiny_tensors(cfg), dtype="fp32")
    assert not any(isinstance(x, PACKED) for x in m.modules())


def test_eagle_draft_head_reads_a_packed_lm_head():
    """The EAGLE head drafts over a subset of the target's vocabulary through the target's LM head: on a packed
    target the rows it takes are the same matrix's."""
    from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig, draft_lm_head
    from specledger.engine.loader import LoadedModel

    dense, packed = _pair()
    lm = LoadedModel(model=dense, tokenizer=None, config=dense.cfg, name="tiny", source="random", dtype="bf16",
                     quant="none", group_size=None, device="cpu", weight_bytes=0, load_s=0.0)
    vocab = torch.tensor([3, 17, 40, 41, 95])
    head = EagleHead(HeadConfig.for_target(lm), draft_vocab=vocab).set_dtype(torch.bfloat16).eval()
    h = torch.randn(2, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = draft_lm_head(head, dense)(h)
        got = draft_lm_head(head, packed)(h)
    assert got.shape == (2, 5)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)


@pytest.mark.kernel
def test_kernel_linear_gradient_is_the_dense_one_on_any_host():
    """The engine's bf16 kernel has no backward either. pack() picks it only where oneDNN cannot pack bf16, so
    the layer is built directly here: its guard is checked on every host that has the kernel, not only there."""
    from specledger.engine import qkernel

    if qkernel.op() is None:
        pytest.skip("the engine's kernel library is not available here")
    g = torch.Generator().manual_seed(4)
    dense = Linear(64, 48, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(48, 64, generator=g))
    kernel = KernelLinear(dense.weight)
    x = torch.randn(3, 64, generator=g).bfloat16()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (dense(xa).float() ** 2).sum().backward()
    (kernel(xb).float() ** 2).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, atol=5e-2, rtol=2e-2)
    with torch.no_grad():  # and off the gradient path it is the kernel's product
        torch.testing.assert_close(kernel(x).float(), dense(x).float(), atol=5e-2, rtol=2e-2)


@pytest.mark.kernel
def test_kernel_product_is_the_fp32_sum_and_each_row_its_own():
    """The engine's bf16 kernel (csrc/bf16mm.cpp): every tail of its tiling (weight rows not a multiple of 8,
    1-5 rows, more than a 64-row block) against the fp32 product of the same numbers, and each row of a batch
    equal bit for bit to that row alone (a batch must not change a request's tokens)."""
    from specledger.engine import qkernel

    if qkernel.op() is None:
        pytest.skip("the engine's kernel library is not available here")
    g = torch.Generator().manual_seed(3)
    for n, k in ((37, 48), (96, 160)):
        w = torch.randn(n, k, generator=g).bfloat16()
        for m in (1, 2, 3, 4, 5, 9, 14, 67):
            x = torch.randn(m, k, generator=g).bfloat16()
            y = torch.ops.specledger.bf16mm(x, w)
            want = x.float() @ w.float().T
            assert y.dtype == torch.bfloat16 and y.shape == (m, n)
            torch.testing.assert_close(y.float(), want, atol=2e-2 * want.abs().max().item(), rtol=1e-2)
            alone = torch.cat([torch.ops.specledger.bf16mm(x[i : i + 1], w) for i in range(m)])
            assert torch.equal(alone, y), (n, k, m)

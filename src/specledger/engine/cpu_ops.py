"""Fused CPU ops of a decode step (csrc/fused.cpp), each beside the PyTorch expression it replaces.

On CPU a decode step of a small model spends as much time in PyTorch's per-op dispatch and small-shape
setup as in arithmetic (benchmarks/decode_step.py's "rest"): RMSNorm is six eager ops, one query's
attention two batched matmuls, a softmax and casts. Where the engine's kernel library is loaded
(engine/qkernel.py) and the tensors are CPU float32 as these ops expect, one call does each; everywhere
else (CUDA, another architecture, SPECLEDGER_QKERNEL=off) the PyTorch expression runs, so results agree
to float32 rounding either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specledger.engine import qkernel


def _fused(*ts: torch.Tensor) -> bool:
    """The fused op may serve: the library is loaded and nothing here needs a gradient (the fused ops have no
    backward; EAGLE head training backpropagates through these layers and gets the PyTorch expressions)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return False
    return qkernel.op() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension, returned in out_dtype."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and _fused(x, weight):
        return torch.ops.specledger.rms_norm(x, weight, eps, out_dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps).to(out_dtype)


_KERNEL_CACHE = (torch.float32, torch.bfloat16)  # the cache dtypes the fused attention reads


def _fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return (q.device.type == "cpu" and k.dtype in _KERNEL_CACHE and q.shape[-1] % 8 == 0 and k.stride(-1) == 1
            and _fused(q, k, v))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_dtype: torch.dtype | None = None):
    """One query token (B, H, 1, D) over the cache (B, KV, S, D), heads grouped onto their KV head; (B, H, 1, D).

    For a single query the fused CPU kernel of SDPA spends most of its time on setup (3.5x slower in bf16 here,
    measured); the PyTorch path is two batched matmuls on 3-D views (no copies) and a softmax.
    """
    b, h, n, d = q.shape
    out = out_dtype or v.dtype
    if n == 1 and _fits(q, k, v):
        y = torch.ops.specledger.decode_attention(q.float().view(b, h, d), k, v, _NONE, _NONE, _NONE, out)
        return y.view(b, h, 1, d)
    kv, s = k.shape[1], k.shape[2]
    q3 = q.reshape(b * kv, (h // kv) * n, d) * d**-0.5
    scores = torch.bmm(q3, k.reshape(b * kv, s, d).transpose(1, 2))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.bmm(p, v.reshape(b * kv, s, d)).view(b, h, n, d).to(out)


LONG_RUN = 16  # new rows above which a causal run (a prompt's chunk) may attend in bf16 (causal_attention)


def _bf16_attention() -> bool:
    """The CPU computes in bf16 natively (AVX-512 BF16 or AMX) and its vector kernels are not forced below AVX-512."""
    native = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
    return bool(native) and torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")


_BF16_ATTENTION = _bf16_attention()
_BF16_CACHE: bool | None = None  # None: decided on first use (bf16_cache)


def bf16_cache() -> bool:
    """A CPU bf16 model's KV cache may be bf16: the CPU computes in bf16 and the fused attention (which reads a
    bf16 cache as fp32, at half the memory traffic) is loaded. Elsewhere PyTorch's bf16 batched matmuls of one
    query's attention run ~2x slower than fp32 (model.kv_dtype), and bf16 SDPA needs AVX-512."""
    global _BF16_CACHE
    if _BF16_CACHE is None:
        _BF16_CACHE = _BF16_ATTENTION and qkernel.op() is not None
    return _BF16_CACHE


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows q (B, H, n, D) under a mask (n, S) or (B, 1, n, S) over keys / values (B, KV, S, D): a draft
    tree or chain verified by one sequence; in fp32 where the cache is (a bf16 CPU cache is read as fp32:
    PyTorch's masked bf16 attention of these shapes is the slow one), in the cache's dtype."""
    if keys.device.type == "cpu" and keys.dtype == torch.bfloat16:
        keys, values = keys.float(), values.float()
    return F.scaled_dot_product_attention(q.to(keys.dtype), keys, values, attn_mask=mask,
                                          enable_gqa=q.shape[1] != keys.shape[1])


def causal_mask(start: int, n: int, device) -> torch.Tensor:
    """n new tokens after `start` cached slots: each sees the cache and the new tokens up to itself."""
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                     compute: torch.dtype, mask: torch.Tensor | None = None) -> torch.Tensor:
    """n new rows q (B, H, n, D) after `start` cached entries, each seeing the cache and the new rows up to
    itself, over keys / values (B, KV, start + n, D); (B, H, n, D) in the compute dtype.

    A bf16 model's cache entries are bf16 values (in an fp32 or a bf16 cache: model.kv_dtype), so a long run (a
    prompt's chunk) attends on them in bf16 where the CPU has bf16 arithmetic, and a short one in fp32: the inputs
    are the same numbers, only the softmax weights are rounded, and fp32's flash attention is 2.4x slower at 256 rows
    (823 vs 346 us a layer, measured). A run from an empty cache needs no mask at all; mask: the causal mask if
    the caller has it already."""
    n = q.shape[2]
    if q.device.type == "cpu":  # long runs in bf16 where the CPU computes in bf16, short ones in fp32
        want = torch.bfloat16 if n > LONG_RUN and compute == torch.bfloat16 and _BF16_ATTENTION else torch.float32
        if keys.dtype in _KERNEL_CACHE and keys.dtype != want:
            keys, values = keys.to(want), values.to(want)
    gqa = q.shape[1] != keys.shape[1]
    q = q.to(keys.dtype)
    if start == 0:
        y = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=gqa)
    else:
        mask = causal_mask(start, n, q.device) if mask is None else mask
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
    return y.to(compute)


def rows_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                   lengths: torch.Tensor, allow: torch.Tensor | None = None) -> torch.Tensor:
    """One query per row, q (R, H, D): row r over the first lengths[r] entries of sequence slots[r] of the
    cache (B, KV, S, D), of those only where allow (R, S) is True if given; in the cache's dtype, (R, H, D).
    Decode rows, draft chains and draft trees (a tree row sees the cache and its ancestors) of many sequences
    in one call."""
    if _fits(q, keys, values):
        return torch.ops.specledger.decode_attention(q.float(), keys, values, lengths, slots,
                                                     _NONE if allow is None else allow, values.dtype)
    r, h, d = q.shape
    kv, s = keys.shape[1], keys.shape[2]
    k, v = keys.index_select(0, slots), values.index_select(0, slots)  # copies: the fallback's price
    q3 = q.reshape(r * kv, h // kv, d) * d**-0.5
    scores = torch.bmm(q3, k.reshape(r * kv, s, d).transpose(1, 2)).view(r, kv, h // kv, s)
    hide = torch.arange(s, device=q.device)[None, :] >= lengths[:, None]
    if allow is not None:
        hide |= ~allow[:, :s]
    scores = scores.masked_fill(hide[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype).view(r * kv, h // kv, s)
    return torch.bmm(p, v.reshape(r * kv, s, d)).view(r, h, d)


def swiglu(x13: torch.Tensor, inter: int) -> torch.Tensor:
    """silu(gate) * up of a fused [gate | up] projection output (.., 2 inter)."""
    if x13.device.type == "cpu" and x13.is_contiguous() and _fused(x13):
        return torch.ops.specledger.swiglu(x13)
    gate, up = x13.split(inter, dim=-1)
    return F.silu(gate) * up


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x (B, n, heads, D) by cos/sin (B or 1, n, 1, D) from model.rope_tables
    (sin negated in its first half, so the rotation is x * cos + roll(x, d/2) * sin)."""
    if (x.device.type == "cpu" and x.shape[-1] % 16 == 0 and x.stride(-1) == 1 and cos.dtype == x.dtype
            and cos.stride(-1) == 1 and _fused(x, cos, sin)):
        return torch.ops.specledger.rope(x, cos, sin)
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


def _new_token_fits(dtype: torch.dtype, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor) -> bool:
    """attend_new_token's op serves a token computed in `dtype` on these RoPE tables and caches."""
    return (k_cache.device.type == "cpu" and k_cache.dtype in _KERNEL_CACHE and cos.dtype == dtype and cos.is_contiguous()
            and sin.is_contiguous() and k_cache.shape[-1] % 16 == 0 and k_cache.stride(-1) == 1
            and _fused(cos, sin, k_cache, v_cache))


def attend_new_token(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, start: int, n_heads: int, out_dtype: torch.dtype) -> torch.Tensor | None:
    """One new token per sequence in one call: RoPE on its q and k (qkv (B, 1, (H + 2 KV) D), the fused
    projection's output), k and v written into the caches (B, KV, S, D) at `start`, attention over [0, start];
    (B, 1, H D) in out_dtype. None where the fused op does not apply: the caller runs the op-by-op path."""
    if not (qkv.is_contiguous() and qkv.shape[1] == 1 and _new_token_fits(qkv.dtype, cos, sin, k_cache, v_cache)
            and _fused(qkv)):
        return None
    return torch.ops.specledger.attend_new_token(qkv, cos, sin, k_cache, v_cache, start, n_heads, out_dtype)


_NONE = torch.empty(0, dtype=torch.long)  # no lengths / no slots: every entry, row r on sequence r


def decode_layer(x: torch.Tensor, norms: tuple[torch.Tensor, torch.Tensor], eps: float, products: list,
                 cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                 n_heads: int, act: torch.dtype, qkv_bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """A whole decoder layer for one new token in one call: x (1, 1, hidden) fp32 -> the new residual stream.

    products: the kernel layouts (quant.KernelLayout, or None) of wqkv, wo, w13 and w2. The same ops in the same
    order as the layer's op-by-op path (so bit-identical), for ~1/8 of its Python and dispatch overhead (~80 us a
    layer on a 2-thread CPU). None where it does not apply (a product off the kernel, a fused op's condition).
    qkv_bias: Qwen2's Q/K/V bias, added to the projection in its dtype as Attention.project does."""
    if (any(p is None for p in products) or x.dtype != torch.float32 or x.numel() != x.shape[-1]
            or not x.is_contiguous() or not _fused(x, *norms) or not _new_token_fits(act, cos, sin, k_cache, v_cache)):
        return None
    codes, scales, mins, meta = zip(*products)
    return torch.ops.specledger.decode_layer(x, norms[0], norms[1], eps, list(codes), list(scales), list(mins),
                                             [v for m in meta for v in m], cos, sin, k_cache, v_cache, start,
                                             n_heads, act, qkv_bias)

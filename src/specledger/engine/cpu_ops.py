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


def _fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return (q.device.type == "cpu" and k.dtype == torch.float32 and q.shape[-1] % 8 == 0 and k.stride(-1) == 1
            and _fused(q, k, v))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_dtype: torch.dtype | None = None):
    """One query token (B, H, 1, D) over the cache (B, KV, S, D), heads grouped onto their KV head; (B, H, 1, D).

    For a single query the fused CPU kernel of SDPA spends most of its time on setup (3.5x slower in bf16 here,
    measured); the PyTorch path is two batched matmuls on 3-D views (no copies) and a softmax.
    """
    b, h, n, d = q.shape
    out = out_dtype or v.dtype
    if n == 1 and _fits(q, k, v):
        y = torch.ops.specledger.decode_attention(q.to(k.dtype).view(b, h, d), k, v, _NO_LENGTHS, out)
        return y.view(b, h, 1, d)
    kv, s = k.shape[1], k.shape[2]
    q3 = q.reshape(b * kv, (h // kv) * n, d) * d**-0.5
    scores = torch.bmm(q3, k.reshape(b * kv, s, d).transpose(1, 2))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.bmm(p, v.reshape(b * kv, s, d)).view(b, h, n, d).to(out)


def batched_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                             pad: torch.Tensor) -> torch.Tensor:
    """One query per sequence, q (B, H, 1, D), over padded keys (B, KV, S, D): sequence i sees its first
    lengths[i] entries (pad (B, S) True = not an entry: the same thing as a mask, for the PyTorch path)."""
    b, h, _, d = q.shape
    if _fits(q, keys, values):
        return torch.ops.specledger.decode_attention(q.view(b, h, d), keys, values, lengths, values.dtype).view(b, h, 1, d)
    kv, s = keys.shape[1], keys.shape[2]
    q3 = q.reshape(b * kv, h // kv, d) * d**-0.5
    scores = torch.bmm(q3, keys.reshape(b * kv, s, d).transpose(1, 2)).view(b, kv, h // kv, s)
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype).view(b * kv, h // kv, s)
    return torch.bmm(p, values.reshape(b * kv, s, d)).view(b, h, 1, d)


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


def attend_new_token(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, start: int, n_heads: int, out_dtype: torch.dtype) -> torch.Tensor | None:
    """One new token per sequence in one call: RoPE on its q and k (qkv (B, 1, (H + 2 KV) D), the fused
    projection's output), k and v written into the caches (B, KV, S, D) at `start`, attention over [0, start];
    (B, 1, H D) in out_dtype. None where the fused op does not apply: the caller runs the op-by-op path."""
    if not (qkv.device.type == "cpu" and k_cache.dtype == torch.float32 and qkv.is_contiguous() and qkv.shape[1] == 1
            and cos.dtype == qkv.dtype and cos.is_contiguous() and sin.is_contiguous() and k_cache.shape[-1] % 16 == 0
            and k_cache.stride(-1) == 1 and _fused(qkv, cos, sin, k_cache, v_cache)):
        return None
    return torch.ops.specledger.attend_new_token(qkv, cos, sin, k_cache, v_cache, start, n_heads, out_dtype)


_NO_LENGTHS = torch.empty(0, dtype=torch.long)

"""The ops of a decoder layer, and the one place that chooses which implementation serves them (`resolve`).

On CPU a decode step of a small model spends as much time in PyTorch's per-op dispatch and small-shape
setup as in arithmetic (benchmarks/decode_step.py's "rest"): RMSNorm is six eager ops, one query's
attention two batched matmuls, a softmax and casts. Where the engine's kernel library is loaded
(engine/qkernel.py) one fused call does each (csrc/fused.cpp). The functions here are the PyTorch expressions,
which run anywhere (CUDA, another architecture, SPECLEDGER_QKERNEL=off, with gradients); `resolve` builds, once per
model, the table of ops (`Ops`) its layer calls. Results agree to float32 rounding either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from specledger.engine import qkernel


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension, returned in out_dtype."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps).to(out_dtype)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_dtype: torch.dtype | None = None,
                     hide: torch.Tensor | None = None) -> torch.Tensor:
    """Query tokens (B, H, n, D) over the cache (B, KV, S, D), heads grouped onto their KV head, each sequence's
    entries where hide (B, S) is True left out; (B, H, n, D).

    For a single query the fused CPU kernel of SDPA spends most of its time on setup (3.5x slower in bf16 here,
    measured); this is two batched matmuls on 3-D views (no copies) and a softmax.
    """
    b, h, n, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    q3 = q.reshape(b * kv, (h // kv) * n, d) * d**-0.5
    scores = torch.bmm(q3, k.reshape(b * kv, s, d).transpose(1, 2))
    if hide is not None:
        scores = scores.view(b, kv, -1, s).masked_fill(hide[:, None, None, :], float("-inf")).view(b * kv, -1, s)
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.bmm(p, v.reshape(b * kv, s, d)).view(b, h, n, d).to(out_dtype or v.dtype)


LONG_RUN = 16  # new rows above which a causal run (a prompt's chunk) may attend in bf16 (Ops.causal_attention)
_KERNEL_CACHE = (torch.float32, torch.bfloat16)  # the cache dtypes the fused attention reads
# rows from which a causal run after cached entries attends split (cached_then_causal) rather than masked: the split's
# two calls and its copies of grouped heads cost more than the mask below (Qwen 1.5B shapes, one layer, bf16, S29:
# 256 rows after 256 1.19x slower split, 1,024 after 1,024 0.92x, 2,048 after 2,048 0.78x)
SPLIT_RUN = 1024


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows q (B, H, n, D) under a mask (n, S) or (B, 1, n, S) over keys / values (B, KV, S, D): a draft
    tree or chain verified by one sequence; in fp32 where the cache is (a bf16 CPU cache is read as fp32:
    PyTorch's masked bf16 attention of these shapes is the slow one), in the cache's dtype."""
    if keys.device.type == "cpu" and keys.dtype == torch.bfloat16:
        keys, values = keys.float(), values.float()
    return F.scaled_dot_product_attention(q.to(keys.dtype), keys, values, attn_mask=mask,
                                          enable_gqa=q.shape[1] != keys.shape[1])


def cached_then_causal(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention of n rows q (B, H, n, D) after `start` cached entries of keys / values (B, KV, start + n, D)
    without a mask: the cached part attended in full and the new part causally, each by the CPU's flash kernel, the two
    merged by their log-sum-exps; fp32 (B, H, n, D).

    With a boolean mask the kernel visits every block and reads the mask; split, it skips the blocks above the
    diagonal and reads none (benchmarks/prompt_attention.py --long, S29, Qwen 1.5B shapes: a 2,048-row chunk's layer
    0.73-0.82x the masked call's time after 2,048 cached tokens, 0.89-0.91x after 14,336). The halves are rounded to
    the kernel's dtype before the merge: one rounding more than the masked call (the chunk's top-1 tokens unchanged)."""
    rep = q.shape[1] // keys.shape[1]
    if rep > 1:  # the kernel takes no grouped heads
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    old, old_lse = flash(q, keys[:, :, :start], values[:, :, :start], 0.0, False)
    new, new_lse = flash(q, keys[:, :, start:], values[:, :, start:], 0.0, True)
    share = torch.sigmoid(old_lse.float() - new_lse.float())[..., None]  # the cached part's share of each row's mass
    return torch.lerp(new.float(), old.float(), share)


def causal_mask(start: int, n: int, device) -> torch.Tensor:
    """n new tokens after `start` cached slots: each sees the cache and the new tokens up to itself."""
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)


def rows_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                   lengths: torch.Tensor, allow: torch.Tensor | None = None) -> torch.Tensor:
    """One query per row, q (R, H, D): row r over the first lengths[r] entries of sequence slots[r] of the
    cache (B, KV, S, D), of those only where allow (R, S) is True if given; in the cache's dtype, (R, H, D).
    Decode rows, draft chains and draft trees (a tree row sees the cache and its ancestors) of many sequences
    in one call."""
    k, v = keys.index_select(0, slots), values.index_select(0, slots)  # copies: the fallback's price
    hide = torch.arange(k.shape[2], device=q.device)[None, :] >= lengths[:, None]
    if allow is not None:
        hide |= ~allow[:, : k.shape[2]]
    return decode_attention(q[:, :, None], k, v, hide=hide)[:, :, 0]


def swiglu(x13: torch.Tensor, inter: int) -> torch.Tensor:
    """silu(gate) * up of a fused [gate | up] projection output (.., 2 inter)."""
    gate, up = x13.split(inter, dim=-1)
    return F.silu(gate) * up


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x (B, n, heads, D) by cos/sin (B or 1, n, 1, D) from model.rope_tables
    (sin negated in its first half, so the rotation is x * cos + roll(x, d/2) * sin)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


def declines(*args: Any) -> None:
    """A fused call that does not exist here (Ops.attend_new_token, Ops.decode_layer): the caller runs op by op."""


@dataclass(frozen=True)
class Ops:
    """The ops a model's layer calls, chosen once by `resolve` from what holds for the model's whole life; the
    defaults are the PyTorch expressions. What can change from one call to the next is checked inside the fused
    ops, each falling back to its PyTorch expression: a gradient wanted (EAGLE head training runs the same modules
    under autograd, and the fused ops have no backward) and a view whose strides, dtype or shape the kernel does not
    take (a query row in a longer run, an fp16 cache)."""

    path: str  # which kernels serve, as run.json, the report and /health say it (qkernel.describe())
    cpu: bool = False  # the CPU's attention dtypes (kv_dtype, causal_attention); elsewhere the compute dtype's
    bf16_attention: bool = False  # the CPU computes in bf16: a bf16 model's long causal runs attend in bf16
    bf16_cache: bool = False  # ...and the fused attention reads bf16: a bf16 model's KV cache is bf16
    qmm: Any = None  # the engine's quantized product (engine/quant.py), None: PyTorch's
    rms_norm: Callable[..., torch.Tensor] = rms_norm
    swiglu: Callable[..., torch.Tensor] = swiglu
    apply_rope: Callable[..., torch.Tensor] = apply_rope
    decode_attention: Callable[..., torch.Tensor] = decode_attention
    rows_attention: Callable[..., torch.Tensor] = rows_attention
    attend_new_token: Callable[..., torch.Tensor | None] = declines
    decode_layer: Callable[..., torch.Tensor | None] = declines

    def kv_dtype(self, compute: torch.dtype) -> torch.dtype:
        """The KV cache's dtype: the compute dtype, except on CPU: fp32 there, or bf16 for a bf16 model where the CPU
        computes in bf16 and the fused attention reads bf16 (bf16_cache).

        CPU bf16 batched matmuls of attention's shapes run ~2x slower than fp32 here (measured: 91 vs 37 us per
        layer at 200 cached tokens), so without the fused kernel the cache stays fp32. A bf16 model's keys and
        values are bf16 numbers, so a bf16 cache holds the same values at half the bytes (the fused one-token path
        rounds k to bf16 after RoPE, as the op-by-op path does); attention still sums in fp32.
        """
        if not self.cpu:
            return compute
        return torch.bfloat16 if compute == torch.bfloat16 and self.bf16_cache else torch.float32

    def causal_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                         compute: torch.dtype, mask: torch.Tensor | None = None) -> torch.Tensor:
        """n new rows q (B, H, n, D) after `start` cached entries, each seeing the cache and the new rows up to
        itself, over keys / values (B, KV, start + n, D); (B, H, n, D) in the compute dtype.

        A bf16 model's cache entries are bf16 values (in an fp32 or a bf16 cache: kv_dtype), so on a CPU a long run
        (a prompt's chunk) attends on them in bf16 where the CPU has bf16 arithmetic, and a short one in fp32: the
        inputs are the same numbers, only the softmax weights are rounded, and fp32's flash attention is 2.4x slower
        at 256 rows (823 vs 346 us a layer, measured). A run from an empty cache needs no mask at all, nor does
        a long run on a CPU after cached entries (cached_then_causal); mask: the causal mask if the caller has it
        already (for the other runs)."""
        n = q.shape[2]
        if self.cpu:
            bf16 = n > LONG_RUN and compute == torch.bfloat16 and self.bf16_attention
            want = torch.bfloat16 if bf16 else torch.float32
            if keys.dtype in _KERNEL_CACHE and keys.dtype != want:
                keys, values = keys.to(want), values.to(want)
        gqa = q.shape[1] != keys.shape[1]
        q = q.to(keys.dtype)
        if start == 0:
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=gqa)
        elif self.cpu and n >= SPLIT_RUN and keys.dtype in _KERNEL_CACHE:
            y = cached_then_causal(q, keys, values, start)
        else:
            mask = causal_mask(start, n, q.device) if mask is None else mask
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
        return y.to(compute)


def resolve(device: torch.device | str) -> Ops:
    """The one place the engine's kernels are chosen, from what holds for a model's whole life: its device, whether
    the kernel library loaded here (and its instruction-set path, qkernel.describe()), whether the CPU computes in
    bf16. A model takes its table when it is loaded or moved (engine/model.py: Transformer.set_compute_dtype)."""
    device = torch.device(device)
    if device.type != "cpu":
        return Ops(f"PyTorch's kernels on {device.type}")
    # bf16 arithmetic: AVX-512 BF16 or AMX, and the vector kernels not forced below AVX-512
    bf16 = bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()) and (
        torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2"))
    qmm = qkernel.op()
    if qmm is None:
        return Ops(qkernel.describe(), cpu=True, bf16_attention=bf16)
    return Ops(qkernel.describe(), True, bf16, bf16, qmm, _rms_norm, _swiglu, _rope, _decode_attention,
               _rows_attention, _attend_new_token, _decode_layer)


# --- the fused ops (csrc/fused.cpp), each falling back per call to the expression above ----------------------


def _no_grad(*ts: torch.Tensor) -> bool:
    return not torch.is_grad_enabled() or not any(t.requires_grad for t in ts)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    if x.dtype == torch.float32 and x.is_contiguous() and _no_grad(x, weight):
        return torch.ops.specledger.rms_norm(x, weight, eps, out_dtype)
    return rms_norm(x, weight, eps, out_dtype)


def _attends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return k.dtype in _KERNEL_CACHE and q.shape[-1] % 8 == 0 and k.stride(-1) == 1 and _no_grad(q, k, v)


_NONE = torch.empty(0, dtype=torch.long)  # no lengths / no slots: every entry, row r on sequence r


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_dtype: torch.dtype | None = None):
    b, h, n, d = q.shape
    if n != 1 or not _attends(q, k, v):
        return decode_attention(q, k, v, out_dtype)
    y = torch.ops.specledger.decode_attention(q.float().view(b, h, d), k, v, _NONE, _NONE, _NONE, out_dtype or v.dtype)
    return y.view(b, h, 1, d)


def _rows_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                    lengths: torch.Tensor, allow: torch.Tensor | None = None) -> torch.Tensor:
    if not _attends(q, keys, values):
        return rows_attention(q, keys, values, slots, lengths, allow)
    return torch.ops.specledger.decode_attention(q.float(), keys, values, lengths, slots,
                                                 _NONE if allow is None else allow, values.dtype)


def _swiglu(x13: torch.Tensor, inter: int) -> torch.Tensor:
    if x13.is_contiguous() and _no_grad(x13):
        return torch.ops.specledger.swiglu(x13)
    return swiglu(x13, inter)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if (x.shape[-1] % 16 == 0 and x.stride(-1) == 1 and cos.dtype == x.dtype and cos.stride(-1) == 1
            and _no_grad(x, cos, sin)):
        return torch.ops.specledger.rope(x, cos, sin)
    return apply_rope(x, cos, sin)


def _new_token_fits(dtype: torch.dtype, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor) -> bool:
    """The one-token ops serve a token computed in `dtype` on these RoPE tables and caches."""
    return (k_cache.dtype in _KERNEL_CACHE and cos.dtype == dtype and cos.is_contiguous() and sin.is_contiguous()
            and k_cache.shape[-1] % 16 == 0 and k_cache.stride(-1) == 1 and _no_grad(cos, sin, k_cache, v_cache))


def _attend_new_token(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, start: int, n_heads: int, out_dtype: torch.dtype) -> torch.Tensor | None:
    """One new token per sequence in one call: RoPE on its q and k (qkv (B, 1, (H + 2 KV) D), the fused
    projection's output), k and v written into the caches (B, KV, S, D) at `start`, attention over [0, start];
    (B, 1, H D) in out_dtype. None where it does not apply: the caller runs the op-by-op path."""
    if not (qkv.is_contiguous() and qkv.shape[1] == 1 and _no_grad(qkv)
            and _new_token_fits(qkv.dtype, cos, sin, k_cache, v_cache)):
        return None
    return torch.ops.specledger.attend_new_token(qkv, cos, sin, k_cache, v_cache, start, n_heads, out_dtype)


def _decode_layer(layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, start: int) -> torch.Tensor | None:
    """A whole decoder layer (engine/model.py's Block) for one new token x (1, 1, hidden) fp32 in one call, k / v
    into the caches (1, KV, S, D) at `start`; the new residual stream. The same ops in the same order as the layer's
    op-by-op path (so bit-identical), for ~1/8 of its Python and dispatch overhead (~80 us a layer on a 2-thread CPU).
    None where it does not apply: a product off the kernel, Qwen3's per-head norms, no input norm (an EAGLE head's
    layer may have none), a fused op's condition. Qwen2's Q/K/V bias is added to the projection as Attention.project
    adds it."""
    a, f, n1, n2 = layer.attention, layer.feed_forward, layer.attention_norm, layer.ffn_norm
    if (a.q_norm is not None or getattr(n1, "eps", None) != n2.eps or x.dtype != torch.float32
            or x.numel() != x.shape[-1] or not x.is_contiguous() or not _no_grad(x, n1.weight, n2.weight)
            or not _new_token_fits(n1.out_dtype, cos, sin, k_cache, v_cache)):
        return None
    products = [m.kernel_layout() for m in (a.wqkv, a.wo, f.w13, f.w2)]  # engine/linear.py: LinearProduct
    if any(p is None for p in products):
        return None
    codes, scales, mins, meta = zip(*products)
    return torch.ops.specledger.decode_layer(x, n1.weight, n2.weight, n1.eps, list(codes), list(scales), list(mins),
                                             [v for m in meta for v in m], cos, sin, k_cache, v_cache, start,
                                             a.n_heads, n1.out_dtype, a.bias)

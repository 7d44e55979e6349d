"""A Llama-family decoder in plain PyTorch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

The modules here hold the parameters, and ragged_block runs them: one pass over one or many sequences of a
SlotCache, planned and attended by engine/ragged.py; a plain forward of a batch is that pass with one slot per row.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from specledger.engine.config import ModelConfig
from specledger.engine.cpu_ops import Ops, masked_attention, resolve
from specledger.engine.linear import KernelLayout, LinearProduct
from specledger.engine.ragged import RaggedPass, Segment, batched_attention, finish_pass, plan_pass, rope_at
from specledger.engine.slot_cache import SlotCache


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies, with the config's scaling (linear or llama3) applied."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type")
    if kind == "linear":
        inv = inv / float(sc["factor"])
    elif kind == "llama3":
        factor = float(sc["factor"])
        low, high = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
        old_ctx = float(sc.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        smooth = ((old_ctx / wavelen) - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif kind == "freq_factors":  # GGUF stores llama3-style scaling as per-frequency divisors
        inv = inv / torch.tensor(sc["factors"], dtype=torch.float64)
    elif kind not in (None, "default"):
        from specledger.errors import UnsupportedModel

        raise UnsupportedModel(f"RoPE scaling type {kind!r} is not supported (supported: linear, llama3)")
    return inv.float()


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin per position (max_seq_len, head_dim), for apply_rope.

    Rotating pairs (i, i + d/2) is x*cos + (-x2, x1)*sin; (-x2, x1)*sin = roll(x, d/2)*sin'
    with sin' negated in its first half, which saves the chunk/neg/cat of every call.
    """
    freqs = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), rope_inv_freq(cfg))
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    sin[:, : freqs.shape[1]].neg_()
    return emb.cos(), sin


def direct_call(cls: type[nn.Module]) -> type[nn.Module]:
    """Make calling a module run its `forward` straight away, without nn.Module's hook dispatch.

    The engine registers no hooks, and the dispatch around the ~9 module calls of every layer
    cost ~3% of a W4A16 decode step here (benchmarks/decode_step.py). Apply to leaf classes only:
    the alias is the class's own `forward`.
    """
    cls.__call__ = cls.forward  # type: ignore[method-assign]
    return cls


@direct_call
class Linear(nn.Linear):
    """nn.Linear, called directly (see direct_call)."""

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + self(x) (the quantized linears fuse the add into their product)."""
        return residual + self(x)

    def kernel_layout(self) -> KernelLayout | None:
        """None: a dense product is not one of the engine kernel's (KernelLinear's bf16 one neither)."""
        return None


class Kernels(nn.Module):
    """A module that runs the engine's ops: `ops`, the table for the device its weights are on (cpu_ops.resolve),
    chosen when it is loaded (Transformer.set_compute_dtype) or moved or cast (`.to`: an EAGLE head is built, cast,
    then moved), never per call; the PyTorch expressions before that."""

    ops = Ops("PyTorch's ops")

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.ops = resolve(fn(torch.empty(0)).device)
        return self


@direct_call
class RMSNorm(Kernels):
    """Normalises the fp32 residual stream and hands the result on in the compute dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.out_dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps, self.out_dtype)


def kv_dtype(compute: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's dtype for a model computing in `compute` on `device` (cpu_ops.Ops.kv_dtype)."""
    return resolve(device).kv_dtype(compute)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.split = (q_out, kv_out, kv_out)
        self.wqkv: LinearProduct = Linear(cfg.hidden_size, q_out + 2 * kv_out, bias=False)  # engine/linear.py
        self.wo: LinearProduct = Linear(q_out, cfg.hidden_size, bias=False)
        # Qwen2's Q/K/V bias lives beside the product (not in it), so every backend of wqkv (dense, packed,
        # int4, int8, the fused layer) adds the same bias the same way.
        self.bias = nn.Parameter(torch.zeros(q_out + 2 * kv_out)) if cfg.qkv_bias else None
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None  # Qwen3: per head, before RoPE
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The fused Q/K/V projection (b, n, q + 2 kv) with the architecture's bias and per-head Q/K norms: the
        one place the layer (ragged_block) and the head's training layer get Q, K and V from."""
        qkv = self.wqkv(x)
        if self.bias is not None:
            qkv = qkv + self.bias
        if self.q_norm is None or self.k_norm is None:
            return qkv
        b, n, _ = qkv.shape
        qk_out = self.split[0] + self.split[1]
        heads = qkv[..., :qk_out].reshape(b, n, self.n_heads + self.n_kv, self.hd).float()
        q = self.q_norm(heads[:, :, : self.n_heads].contiguous())
        k = self.k_norm(heads[:, :, self.n_heads :].contiguous())
        return torch.cat([q.reshape(b, n, -1), k.reshape(b, n, -1), qkv[..., qk_out:]], dim=-1).to(qkv.dtype)


@direct_call
class FeedForward(Kernels):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.w13: LinearProduct = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w2: LinearProduct = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + MLP(x)."""
        return self.w2.add_to(self.ops.swiglu(self.w13(x), self.inter), residual)


class Block(Kernels):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm: nn.Module = RMSNorm(cfg.hidden_size, cfg.rms_eps)  # an EAGLE head's may be a cast
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.feed_forward = FeedForward(cfg)


def ragged_block(layer: Block, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: RaggedPass,
                 cache: SlotCache) -> torch.Tensor:
    """One decoder layer over the pass's rows x (1, N, hidden), attending per segment in cache layer i: the engine's
    only layer at inference (a plain forward, decoding, drafting, the EAGLE head), so every path computes alike."""
    a, ops = layer.attention, layer.ops
    n_rows = plan.n_rows
    if plan.one_token:  # one sequence decoding: the whole layer in one call where it can
        slot = plan.segments[0].slot
        y = ops.decode_layer(layer, x, cos, sin, cache.slot_k[i][slot][None], cache.slot_v[i][slot][None],
                             plan.starts[0])
        if y is not None:
            return y
    h = layer.attention_norm(x)  # in the compute dtype
    qkv = a.project(h)
    if plan.one_token:  # else RoPE, the cache write and attention in one call where it can
        slot = plan.segments[0].slot
        y1 = ops.attend_new_token(qkv, cos, sin, cache.slot_k[i][slot][None], cache.slot_v[i][slot][None], plan.starts[0],
                              a.n_heads, h.dtype)
        if y1 is not None:
            x = a.wo.add_to(y1, x)
            return layer.feed_forward(layer.ffn_norm(x), x)
    qk_out = a.split[0] + a.split[1]
    qk = ops.apply_rope(qkv[..., :qk_out].view(1, n_rows, a.n_heads + a.n_kv, a.hd), cos, sin)[0]
    q = qk[:, : a.n_heads].transpose(0, 1)  # (H, N, D)
    k = qk[:, a.n_heads :].transpose(0, 1)  # (KV, N, D)
    v = qkv[0, :, qk_out:].view(n_rows, a.n_kv, a.hd).transpose(0, 1)
    b = plan.batched
    if b is not None and b.all_rows:
        y = batched_attention(b, cache, i, q, k, v, ops)  # (N, H, D)
    else:
        y = q.new_empty((n_rows, a.n_heads, a.hd), dtype=h.dtype)
        if b is not None:
            y.index_copy_(0, b.rows, batched_attention(b, cache, i, q, k, v, ops).to(h.dtype))
        for j in plan.alone:
            s, st, o, m = plan.segments[j], plan.starts[j], plan.offsets[j], plan.masks[j]
            keys, values = cache.write(i, s.slot, st, k[:, o : o + s.n], v[:, o : o + s.n])
            qs = q[:, o : o + s.n][None]
            if s.mask is None and s.n > 1:  # (a prompt's chunk)
                ys = ops.causal_attention(qs, keys[None], values[None], st, h.dtype, m)[0]
            elif m is None:  # (in the compute dtype already: one cast fewer per layer)
                ys = ops.decode_attention(qs.to(keys.dtype), keys[None], values[None], h.dtype)[0]
            else:
                ys = masked_attention(qs, keys[None], values[None], m)[0]
            y[o : o + s.n] = ys.transpose(0, 1)
    x = a.wo.add_to(y.reshape(1, n_rows, -1).to(h.dtype), x)
    return layer.feed_forward(layer.ffn_norm(x), x)


def ragged_hidden(
    model: Transformer,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    segments: list[Segment],
    cache: SlotCache,
) -> torch.Tensor:
    """Run the rows (N,) at RoPE positions (N,), grouped into segments in order; return final-normed hidden (N, H).

    Each segment's new entries are appended to its slot (its length grows by n).
    """
    n_rows = tokens.shape[0]
    if sum(s.n for s in segments) != n_rows or positions.shape[0] != n_rows:
        raise ValueError("segments, tokens and positions disagree on the number of rows")
    plan = plan_pass(segments, cache, tokens.device)
    cos, sin = rope_at(model.rope_cos, model.rope_sin, positions, model.dtype)
    x = model.tok_embeddings(tokens[None]).float()  # (1, N, hidden): the residual stream stays fp32
    for i, module in enumerate(cast("list[Block]", model.layers)):
        x = ragged_block(module, i, x, cos, sin, plan, cache)
    finish_pass(plan, cache)
    return model.norm(x)[0]


def new_slot_cache(model: Transformer, n_slots: int, max_len: int | None = None) -> SlotCache:
    """A slot cache shaped for this model, in its KV dtype and on its device."""
    c = model.cfg
    return SlotCache(c.n_layers, c.n_kv_heads, c.head_dim, n_slots, max_len or c.max_seq_len,
                     dtype=model.kv_dtype, device=model.device)


class Transformer(Kernels):
    rope_cos: torch.Tensor  # buffers, set by init_rope
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.output: nn.Module = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)  # loader.py: or Int8Linear
        self.init_rope()

    def init_rope(self, device: torch.device | str | None = None) -> None:
        cos, sin = rope_tables(self.cfg)
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: matrix products, attention and the KV cache."""
        return self.tok_embeddings.weight.dtype

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        """The compute dtype, and the kernels for the device the weights are on now (the loader calls this once it
        has placed them)."""
        for m in self.modules():
            if isinstance(m, RMSNorm):
                m.out_dtype = dtype
        self.use_ops(resolve(self.device))

    def use_ops(self, ops: Ops) -> None:
        """Every layer of the model runs `ops` (tests and benchmarks: a chosen table)."""
        for m in self.modules():
            if isinstance(m, Kernels):
                m.ops = ops

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.ops.kv_dtype(self.dtype)

    def new_cache(self, max_len: int | None = None, batch: int = 1) -> SlotCache:
        """A cache for `forward` over `batch` rows: one slot per row, every slot taken."""
        cache = new_slot_cache(self, batch, max_len)
        for _ in range(batch):
            cache.alloc()
        return cache

    def hidden(self, tokens: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        """Run n new tokens (B, n), row b on slot b of the cache after its entries, causally; return final-normed
        hidden states (B, n, hidden). The ragged pass (ragged_hidden) with one segment per row; each slot's length
        grows by n (masks and positions of their own: ragged_hidden's segments)."""
        b, n = tokens.shape
        pos = torch.cat([torch.arange(cache.lengths[r], cache.lengths[r] + n, device=tokens.device) for r in range(b)])
        return ragged_hidden(self, tokens.reshape(-1), pos, [Segment(r, n) for r in range(b)], cache).view(b, n, -1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(h).float()

    def forward(self, tokens: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        return self.logits(self.hidden(tokens, cache))

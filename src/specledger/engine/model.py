"""A Llama-family decoder in plain PyTorch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

One forward pass takes n new tokens at explicit positions under an explicit attention
mask over the cache, which is all that chains, trees and plain decoding need.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specledger.engine.config import ModelConfig
from specledger.engine.kv_cache import KVCache


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


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    """Normalises the fp32 residual stream and hands the result on in the compute dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.out_dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps).to(self.out_dtype)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query token over the cache, heads grouped onto their KV head.

    For a single query the fused CPU kernel spends most of its time on setup (3.5x slower
    in bf16 here, measured); two small matmuls and a softmax in fp32 are cheaper.
    """
    b, h, n, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    scores = (q.reshape(b, kv, (h // kv) * n, d) @ k.transpose(-1, -2)).float().mul_(d**-0.5)
    p = torch.softmax(scores, dim=-1).to(v.dtype)
    return (p @ v).view(b, h, n, d)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.split = (q_out, kv_out, kv_out)
        self.wqkv = nn.Linear(cfg.hidden_size, q_out + 2 * kv_out, bias=False)
        self.wo = nn.Linear(q_out, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, cache: KVCache, layer: int, start: int, mask):
        b, n, _ = x.shape
        q, k, v = self.wqkv(x).split(self.split, dim=-1)
        q = q.view(b, n, self.n_heads, self.hd).transpose(1, 2)
        k = k.view(b, n, self.n_kv, self.hd).transpose(1, 2)
        v = v.view(b, n, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys, values = cache.write(layer, start, k, v)
        if n == 1 and mask is None:
            y = decode_attention(q, keys, values)
        else:
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return self.wo(y.transpose(1, 2).reshape(b, n, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.w13 = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.inter, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin, cache, layer, start, mask):
        # The residual stream stays fp32 whatever the compute dtype: 30 layers of bf16
        # additions cost measurable agreement with the fp32 model, the casts cost ~nothing.
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, layer, start, mask).float()
        return x + self.feed_forward(self.ffn_norm(x)).float()


def causal_mask(start: int, n: int, device) -> torch.Tensor:
    """n new tokens after `start` cached slots: each sees the cache and the new tokens up to itself."""
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        inv = rope_inv_freq(cfg)
        t = torch.arange(cfg.max_seq_len, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: matrix products, attention and the KV cache."""
        return self.tok_embeddings.weight.dtype

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        for m in self.modules():
            if isinstance(m, RMSNorm):
                m.out_dtype = dtype

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    def new_cache(self, max_len: int | None = None, batch: int = 1) -> KVCache:
        c = self.cfg
        return KVCache(
            c.n_layers, c.n_kv_heads, c.head_dim, max_len or c.max_seq_len, batch=batch, dtype=self.dtype, device=self.device
        )

    def hidden(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        *,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run n new tokens (B, n) on top of the cache's valid slots; return final-normed hidden states.

        positions: RoPE positions (n,) or (B, n); default: consecutive after the cache.
        mask: (n, cached + n) or (B, 1, n, cached + n) bool, True = may attend; default causal.
        The new entries are appended to the cache (cache.length grows by n).
        """
        b, n = tokens.shape
        start = cache.length
        if start + n > cache.max_len:
            from specledger.errors import BadInput

            raise BadInput(f"sequence of {start + n} tokens exceeds the context of {cache.max_len}")
        if positions is None:
            cos = self.rope_cos[start : start + n]
            sin = self.rope_sin[start : start + n]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        if cos.dim() == 2:
            cos, sin = cos[None, None], sin[None, None]
        else:
            cos, sin = cos[:, None], sin[:, None]
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)
        if mask is None and n > 1:
            mask = causal_mask(start, n, tokens.device)
        x = self.tok_embeddings(tokens).float()
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, start, mask)
        cache.length = start + n
        return self.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(h).float()

    def forward(self, tokens, cache, *, positions=None, mask=None, last_only: bool = False):
        h = self.hidden(tokens, cache, positions=positions, mask=mask)
        if last_only:
            h = h[:, -1:]
        return self.logits(h)

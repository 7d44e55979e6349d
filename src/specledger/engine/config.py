"""The shape of a Llama-family decoder, independent of where its weights come from.

Qwen2 is the Llama block with a bias on the Q, K and V projections (qkv_bias); Qwen3 drops the bias and
normalises every head of Q and K (RMSNorm over head_dim, before RoPE: qk_norm)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    rope_scaling: dict | None = None
    eos_ids: list[int] = field(default_factory=list)
    arch: str = "llama"  # llama | qwen2 | qwen3 (what the flags below mean for a file's names and layout)
    qkv_bias: bool = False
    qk_norm: bool = False

    @property
    def n_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * self.n_heads * self.head_dim * 2 + h * self.n_kv_heads * self.head_dim * 2
        per_layer = attn + 3 * h * i + 2 * h
        per_layer += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim if self.qkv_bias else 0
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        emb = v * h * (1 if self.tie_embeddings else 2)
        return self.n_layers * per_layer + emb + h

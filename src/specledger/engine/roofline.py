"""What a model at a precision must read per decode token and multiply per prefill token: the limits that a decode
or prefill figure is a share of (benchmarks/roofline.py measures the host's side: read bandwidth, product peaks).

Bytes are counted in the layout the engine holds a model in after loading (engine/loader.py, quant.py), not the
file's: a W4 matrix is 4-bit codes plus an fp16 scale and an fp16 min per group of 32 inputs (5.0 bits a weight at
g32, whatever the GGUF type was: a Q4_K file's 4.5 bits are re-laid as 5), W8 is int8 codes plus an fp16 scale per
block of 32 (8.5 bits), and both pad their output rows to a multiple of 16 (the kernel's tiles); the quantized
models keep the embedding at the compute dtype and the LM head at W8. `model_bytes` is what loading holds
(tests/engine/test_roofline.py checks it against loaded models), the memory plan's figure (bench/memory_plan.py).

One decode token at c=1 reads (`decode_bytes`): every layer's four products (fused QKV, O, gate/up, down) and the
LM head once, whole; one row of the embedding; the norms' and biases' vectors; and the KV cache of `context`
earlier positions (K and V of every layer, at the cache's dtype). Not counted: activations and the new token's KV
write (kilobytes, in cache), the RoPE row, the sampler. A batch of c sequences reads the weights once and each
sequence's own KV, so its limit in tokens per second is c times higher where the weights dominate.

A prefill of n tokens multiplies (`prefill_macs`): each token by every layer product's weights (one MAC a weight),
attention's QK and PV (2 x heads x head_dim MACs a layer for every earlier position and itself: causal), and the
LM head for the last token only (the engine computes logits for the rows it samples from). Its limit is the MACs
over the product peak of the precision's arithmetic (`compute_kind`): W4A8/W8A8 take the int8 dot-product peak;
W4A16/W8A16 run each activation as two int8 digits (twice the integer work: half that peak); bf16 and fp32 their
own float peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from specledger.engine.config import ModelConfig

TILE = 16  # the kernel's output-row tile: quantized matrices pad their rows to a multiple of it
BLOCK = 32  # the int8 grid's block (quant.BLOCK)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Precision:
    dtype: str = "fp32"  # the compute dtype (and the unquantized weights')
    quant: str = "none"  # none | int8 | int4
    group_size: int = 32
    activations: int = 16  # bits inside the kernel's quantized products (16: two int8 digits, 8: one)

    @property
    def label(self) -> str:
        if self.quant == "none":
            return self.dtype
        w = "W4" if self.quant == "int4" else "W8"
        return f"{w}A{self.activations}" + (f" g{self.group_size}" if self.quant == "int4" and self.group_size != 32
                                            else "")


def layer_products(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of one layer's products as the engine fuses them: QKV, O, gate/up, down."""
    q, kv, h, i = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    return [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)]


def matrix_bytes(out: int, inp: int, p: Precision) -> int:
    """One product's weight bytes as the engine holds it (the kernel's layout for quantized ones)."""
    if p.quant == "none":
        return out * inp * DTYPE_BYTES[p.dtype]
    rows = -(-out // TILE) * TILE
    if p.quant == "int8":
        return rows * inp + rows * (inp // BLOCK) * 2
    return rows * inp // 2 + 2 * rows * (inp // p.group_size) * 2  # codes, fp16 scales and mins


@dataclass(frozen=True)
class ModelBytes:
    """A loaded model's bytes by part."""

    layers: int  # the layers' products
    head: int  # the LM head (0 where it is the embedding itself: a tied fp32 model)
    embedding: int
    vectors: int  # norms, biases, per-head norms
    embedding_row: int  # what one token's lookup reads

    @property
    def resident(self) -> int:
        return self.layers + self.head + self.embedding + self.vectors

    @property
    def per_token(self) -> int:
        """Weight bytes one decode step reads (the KV cache aside)."""
        head = self.head or self.embedding
        return self.layers + head + self.embedding_row + self.vectors


def model_bytes(cfg: ModelConfig, p: Precision) -> ModelBytes:
    h, v = cfg.hidden_size, cfg.vocab_size
    size = DTYPE_BYTES[p.dtype]
    layers = cfg.n_layers * sum(matrix_bytes(o, i, p) for o, i in layer_products(cfg))
    per_layer_vectors = 2 * h * 4  # the two norms, fp32
    if cfg.qkv_bias:
        per_layer_vectors += (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim * size
    if cfg.qk_norm:
        per_layer_vectors += 2 * cfg.head_dim * 4
    vectors = cfg.n_layers * per_layer_vectors + h * 4
    embedding = v * h * size
    if p.quant != "none":
        head = matrix_bytes(v, h, Precision(p.dtype, "int8"))
    else:  # tied: the embedding itself in fp32, a copy at 16 bits; untied: its own matrix
        head = 0 if cfg.tie_embeddings and p.dtype == "fp32" else v * h * size
    return ModelBytes(layers=layers, head=head, embedding=embedding, vectors=vectors, embedding_row=h * size)


def kv_bytes_per_position(cfg: ModelConfig, kv_element_bytes: int) -> int:
    """K and V of one position in every layer."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * kv_element_bytes


def kv_element_bytes(p: Precision, device: str = "cpu") -> int:
    """The KV cache's element size for this precision on this host (engine/cpu_ops.Ops.kv_dtype)."""
    import torch

    from specledger.engine.loader import parse_dtype
    from specledger.engine.model import kv_dtype

    return torch.empty(0, dtype=kv_dtype(parse_dtype(p.dtype), torch.device(device))).element_size()


def decode_bytes(cfg: ModelConfig, p: Precision, context: int = 0, kv_element: int | None = None) -> int:
    """Bytes one decode token reads at c=1 after `context` cached positions (the module docstring says what counts)."""
    kv = kv_element if kv_element is not None else kv_element_bytes(p)
    return model_bytes(cfg, p).per_token + context * kv_bytes_per_position(cfg, kv)


def product_macs_per_token(cfg: ModelConfig) -> int:
    """The layers' product MACs for one token (one a weight)."""
    return cfg.n_layers * sum(o * i for o, i in layer_products(cfg))


def prefill_macs(cfg: ModelConfig, n_tokens: int, start: int = 0) -> int:
    """MACs of a prefill of `n_tokens` after `start` cached positions: products, causal attention, the LM head once."""
    positions = n_tokens * start + n_tokens * (n_tokens + 1) // 2  # keys each new token attends to, summed
    attention = cfg.n_layers * 2 * cfg.n_heads * cfg.head_dim * positions
    head = cfg.vocab_size * cfg.hidden_size if n_tokens else 0
    return n_tokens * product_macs_per_token(cfg) + attention + head


def compute_kind(p: Precision) -> tuple[str, float]:
    """Which measured peak a prefill at this precision is a share of, and the share of that peak its arithmetic
    can reach at most: ("int8", 0.5) for 16-bit activations (two int8 digits a MAC)."""
    if p.quant == "none":
        return p.dtype, 1.0
    return "int8", 1.0 if p.activations == 8 else 0.5


def decode_limit_tps(cfg: ModelConfig, p: Precision, bandwidth_gbs: float, context: int = 0,
                     kv_element: int | None = None) -> float:
    """Tokens per second at c=1 if every byte moved at `bandwidth_gbs` (GB/s, 1e9) and nothing else took time."""
    return bandwidth_gbs * 1e9 / decode_bytes(cfg, p, context, kv_element)


def prefill_limit_s(cfg: ModelConfig, p: Precision, n_tokens: int, peaks_gmacs: dict[str, float]) -> float:
    """Seconds a prefill of `n_tokens` takes at the precision's product peak (GMAC/s by compute_kind's name)."""
    kind, reach = compute_kind(p)
    return prefill_macs(cfg, n_tokens) / (peaks_gmacs[kind] * 1e9 * reach)

"""Read a Llama-family GGUF file (llama, qwen2, qwen3): config, dequantized tensors, and Q4_1 / Q4_K / Q8_0
codes kept as-is (every other type, e.g. Q4_0, Q5_0, Q5_1, Q6_K, is dequantized and re-quantized by the loader).

llama.cpp's converter interleaves the rows of a llama file's Q and K (its RoPE rotates adjacent pairs), so they are
un-permuted back to HF's rotate-half order; a qwen2 / qwen3 file is converted without that permutation (llama.cpp
runs them with NEOX RoPE, HF's order), so its Q and K are taken as stored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specledger.engine.config import ModelConfig
from specledger.engine.quant import Int4Grid, Int8Grid
from specledger.errors import BadInput, UnsupportedModel

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")
PERMUTED_ARCHS = ("llama",)  # whose Q/K rows llama.cpp's converter interleaved
_LAYER_NAMES = {
    "attn_norm": "attn_norm",
    "attn_q": "q",
    "attn_k": "k",
    "attn_v": "v",
    "attn_output": "o",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "gate",
    "ffn_up": "up",
    "ffn_down": "down",
    "attn_q_norm": "q_norm",  # qwen3
    "attn_k_norm": "k_norm",
}
_BIASES = {"attn_q": "q_bias", "attn_k": "k_bias", "attn_v": "v_bias"}  # qwen2


def open_gguf(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as exc:  # the reader raises bare ValueError/struct errors on junk
        raise BadInput(f"{path} is not a readable GGUF file ({exc})") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_config(reader, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"{path.name}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    g = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731
    hidden = int(g("embedding_length"))
    n_heads = int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv", n_heads))
    names = {t.name for t in reader.tensors}
    vocab = g("vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    if arch in PERMUTED_ARCHS and "blk.0.attn_q.bias" in names:  # (its bias rows would need llama's un-permutation)
        raise UnsupportedModel(f"{path.name}: a {arch} file with attention biases is not supported")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(g("feed_forward_length")),
        n_layers=int(g("block_count")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=int(g("attention.key_length", hidden // n_heads)),
        max_seq_len=int(g("context_length", 2048)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in names,
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_ids=[int(eos)] if eos is not None else [],
        arch=str(arch),
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
    )


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row interleaving so RoPE is the rotate-half form of HF checkpoints."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _q4_1_grid(raw: np.ndarray, rows: int, cols: int) -> Int4Grid:
    """Q4_1 blocks: fp16 d, fp16 m, 16 bytes of nibbles (element j low, j+16 high) per 32 values."""
    blocks = raw.reshape(rows, cols // 32, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
    d_t, m_t = torch.from_numpy(d), torch.from_numpy(m)
    return Int4Grid(torch.from_numpy(codes.astype(np.uint8)), d_t, m_t + 8 * d_t, 32)


def _q4_k_grid(raw: np.ndarray, rows: int, cols: int) -> Int4Grid:
    """Q4_K super-blocks of 256 (144 bytes): fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
    nibbles. Sub-block s of 32 values: w = d sc_s q - dmin m_s, the Q4_1 form at group 32 (scale = d sc_s,
    zero = 8 scale - dmin m_s), so its codes are kept as stored (llama.cpp's get_scale_min_k4 unpacks sc, m:
    sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7, 4-7 in the nibbles of bytes 8-11 with the top 2 bits
    from bytes 0-3 / 4-7; sub-blocks 2j, 2j+1 share qs[32 j : 32 j + 32], low nibble then high)."""
    b = raw.reshape(rows, cols // 256, 144)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = b[..., 4:16]
    lo, hi, ext = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([lo & 63, (ext & 0x0F) | ((lo >> 6) << 4)], axis=-1).astype(np.float32)
    mn = np.concatenate([hi & 63, (ext >> 4) | ((hi >> 6) << 4)], axis=-1).astype(np.float32)
    qs = b[..., 16:].reshape(rows, cols // 256, 4, 1, 32)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(rows, cols)
    scale = torch.from_numpy((d[..., None] * sc).reshape(rows, cols // 32))
    mins = torch.from_numpy((dmin[..., None] * mn).reshape(rows, cols // 32))
    return Int4Grid(torch.from_numpy(codes.astype(np.uint8)), scale, 8 * scale - mins, 32)


def _q8_0_grid(raw: np.ndarray, rows: int, cols: int) -> Int8Grid:
    """Q8_0 blocks: fp16 d, then 32 int8 codes, per 32 values (w = d * q)."""
    blocks = raw.reshape(rows, cols // 32, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
    return Int8Grid(torch.from_numpy(codes), torch.from_numpy(d))


Grid = Int4Grid | Int8Grid
KEPT = {"int4": ("Q4_1", "Q4_K"), "int8": ("Q8_0",)}  # the file types whose codes a precision keeps as stored


def layer_types(reader) -> dict[str, int]:
    """How many of the file's decoder-layer matrices (what quantization replaces) are stored in each type."""
    out: dict[str, int] = {}
    for t in reader.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
    return out


def grid_plan(types: dict[str, int], quant: str, group_size: int) -> tuple[dict[str, int], dict[str, int]]:
    """(kept, re-quantized): the layer matrices whose stored codes the engine keeps at this precision, and those it
    dequantizes and quantizes again (F32/F16/BF16 are not counted: they carry no codes to lose)."""
    kept = KEPT.get(quant, ()) if quant != "int4" or group_size == 32 else ()
    coded = {k: v for k, v in types.items() if k not in ("F32", "F16", "BF16")}
    return ({k: v for k, v in coded.items() if k in kept}, {k: v for k, v in coded.items() if k not in kept})


def read_tensors(reader, cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], dict[str, Grid]]:
    """Canonical float32 tensors (HF orientation [out, in]) and the Q4_1 / Q4_K / Q8_0 grids of the tensors stored
    so."""
    from gguf import GGMLQuantizationType, dequantize

    tensors: dict[str, torch.Tensor] = {}
    grids: dict[str, Grid] = {}
    for t in reader.tensors:
        name = t.name
        if name == "token_embd.weight":
            key = "embed"
        elif name == "output_norm.weight":
            key = "norm"
        elif name == "output.weight":
            key = "output"
        elif name == "rope_freqs.weight":
            key = "rope_freqs"
        elif name.startswith("blk."):
            _, idx, part, kind = name.split(".", 3)
            if kind == "bias" and part in _BIASES and cfg.qkv_bias:
                key = f"layers.{idx}.{_BIASES[part]}"
            elif kind == "weight" and part in _LAYER_NAMES:
                key = f"layers.{idx}.{_LAYER_NAMES[part]}"
            else:
                raise UnsupportedModel(f"unexpected tensor {name} (not a plain Llama / Qwen layer)")
        else:
            raise UnsupportedModel(f"unexpected tensor {name} in GGUF file")
        arr = dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        w = torch.from_numpy(np.array(arr, dtype=np.float32)).reshape(shape)
        grid: Grid | None = None
        if t.tensor_type == GGMLQuantizationType.Q4_1 and len(shape) == 2:
            grid = _q4_1_grid(np.asarray(t.data), *shape)
        elif t.tensor_type == GGMLQuantizationType.Q4_K and len(shape) == 2:
            grid = _q4_k_grid(np.asarray(t.data), *shape)
        elif t.tensor_type == GGMLQuantizationType.Q8_0 and len(shape) == 2:
            grid = _q8_0_grid(np.asarray(t.data), *shape)
        if key.endswith((".q", ".k")) and cfg.arch in PERMUTED_ARCHS:
            heads = cfg.n_heads if key.endswith(".q") else cfg.n_kv_heads
            w = _unpermute(w, heads)
            if isinstance(grid, Int4Grid):
                grid = Int4Grid(_unpermute(grid.codes, heads), _unpermute(grid.scale, heads), _unpermute(grid.zero, heads), 32)
            elif isinstance(grid, Int8Grid):
                grid = Int8Grid(_unpermute(grid.codes, heads), _unpermute(grid.scale, heads))
        tensors[key] = w
        if grid is not None:
            grids[key] = grid
    return tensors, grids

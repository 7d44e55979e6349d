"""Read a Llama-family GGUF file (llama, qwen2, qwen3): config, tensors decoded on demand, and Q4_1 / Q4_K / Q8_0
codes kept as-is (every other type, e.g. Q4_0, Q5_0, Q5_1, Q6_K, is dequantized and re-quantized by the loader).

llama.cpp's converter interleaves the rows of a llama file's Q and K (its RoPE rotates adjacent pairs), so they are
un-permuted back to HF's rotate-half order; a qwen2 / qwen3 file is converted without that permutation (llama.cpp
runs them with NEOX RoPE, HF's order), so its Q and K are taken as stored."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from specledger.engine.config import ModelConfig
from specledger.engine.quant import Int4Grid, Int8Grid
from specledger.engine.weights import LazyGrids, LazyTensors
from specledger.errors import BadInput, UnsupportedModel

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

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
_TOP_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "norm", "output.weight": "output",
              "rope_freqs.weight": "rope_freqs"}


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUF value types
_STRING, _ARRAY = 8, 9


class GGUFTensor(NamedTuple):
    """One entry of the file's tensor directory (what gguf.GGUFReader's tensors carry, bar the field)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # GGUF order: the row length first
    n_bytes: int
    data_offset: int  # in the file
    path: str

    @property
    def data(self) -> np.ndarray:
        """The stored bytes, memory-mapped: [rows, bytes per row] (F32 / F16 as their values)."""
        raw = np.memmap(self.path, np.uint8, "r", self.data_offset, (self.n_bytes,))
        dims = [int(x) for x in reversed(self.shape.tolist())]
        if self.tensor_type.name in ("F32", "F16"):
            return raw.view(np.float32 if self.tensor_type.name == "F32" else np.float16).reshape(dims)
        return raw.reshape(-1, self.n_bytes // max(1, int(np.prod(dims[:-1]))))


class GGUFFile:
    """A GGUF file's metadata (`fields`: key -> value, arrays as lists or numpy arrays) and tensor directory, parsed
    from the header alone. gguf.GGUFReader makes a numpy view of every array element (a Qwen vocabulary's 300,000
    strings: most of a load's time); here string arrays are decoded in one pass and tensors are not touched."""

    def __init__(self, path: Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = str(path)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            self._mm, self._off = mm, 0
            try:
                magic, version, n_tensors, n_kv = self._unpack("<4sIQQ")
                if magic != b"GGUF" or version not in (2, 3):
                    raise ValueError(f"magic {magic!r}, version {version} (GGUF v2/v3, little-endian, expected)")
                self.fields: dict[str, Any] = {}
                for _ in range(n_kv):
                    key = self._string()
                    self.fields[key] = self._value(self._unpack("<I")[0])
                directory = []
                for _ in range(n_tensors):
                    name = self._string()
                    (n_dims,) = self._unpack("<I")
                    dims = self._unpack(f"<{n_dims}Q")
                    kind, offset = self._unpack("<IQ")
                    directory.append((name, dims, GGMLQuantizationType(kind), offset))
                align = int(self.fields.get("general.alignment", 32))
                start = -(-self._off // align) * align
            finally:
                del self._mm
        self.tensors = []
        for name, dims, kind, offset in directory:
            block, size = GGML_QUANT_SIZES[kind]
            n = int(np.prod(dims))
            self.tensors.append(GGUFTensor(name, kind, np.array(dims), n // block * size, start + offset, self.path))
        end = max((t.data_offset + t.n_bytes for t in self.tensors), default=0)
        if end > (size := Path(path).stat().st_size):  # (a tensor read past the end was a traceback, later)
            raise ValueError(f"truncated: {size:,} bytes, its tensors end at byte {end:,} (an interrupted copy?)")

    def _unpack(self, fmt: str) -> tuple:
        out = struct.unpack_from(fmt, self._mm, self._off)
        self._off += struct.calcsize(fmt)
        return out

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        self._off += n
        return bytes(self._mm[self._off - n : self._off]).decode("utf-8", "surrogateescape")

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._unpack("<" + _SCALARS[kind])[0]
        item, count = self._unpack("<IQ")
        if item in _SCALARS:
            out = np.frombuffer(self._mm, np.dtype("<" + _SCALARS[item]), count, self._off).copy()
            self._off += out.nbytes
            return out
        return [self._value(item) for _ in range(count)]


def open_gguf(path: Path) -> GGUFFile:
    try:
        return GGUFFile(path)
    except Exception as exc:  # struct/value/index errors on junk
        raise BadInput(f"{path} is not a readable GGUF file ({exc})") from None


def read_config(reader: GGUFFile, path: Path) -> ModelConfig:
    arch = reader.fields.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"{path.name}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")

    def g(key: str, default: Any = None) -> Any:
        return reader.fields.get(f"{arch}.{key}", default)

    hidden = int(g("embedding_length"))
    n_heads = int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv", n_heads))
    names = {t.name for t in reader.tensors}
    vocab = g("vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"])
    eos = reader.fields.get("tokenizer.ggml.eos_token_id")
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


SLAB = 1 << 22  # values decoded at once: the fp32 form of a whole tensor is never held


def _read_rows(path: str, offset: int, row_bytes: int, start: int, n: int) -> np.ndarray:
    """n rows of a tensor's bytes from the file, read into memory the process owns (not the file's mapping: its
    pages would count as the loader's own memory while it runs)."""
    buf = np.empty(n * row_bytes, np.uint8)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset + start * row_bytes)
        got = f.readinto(buf.data)
    if got != buf.nbytes:
        raise BadInput(f"{path}: truncated tensor data ({got} of {buf.nbytes} bytes)")
    return buf.reshape(n, row_bytes)


def _decode(raw: np.ndarray, kind, cols: int) -> torch.Tensor:
    """Rows of a tensor's bytes -> fp32 [rows, cols] (gguf's own decoding, vectorized over the blocks)."""
    from gguf import dequantize

    return torch.from_numpy(np.asarray(dequantize(raw, kind), np.float32)).reshape(raw.shape[0], cols)


def _reader(t, path: str, shape: tuple[int, ...], heads: int | None):
    """The tensor's Reader (weights.py): its rows decoded a slab at a time straight into the dtype asked for, Q/K
    of a permuted arch un-permuted."""
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    row_bytes = int(t.n_bytes) // rows

    def read(dtype: torch.dtype, sel: slice | None = None) -> torch.Tensor:
        start, stop, step = (sel or slice(None)).indices(rows)
        if step != 1 or (heads is not None and (start, stop) != (0, rows)):
            raise ValueError(f"{t.name}: rows {sel} cannot be read apart")
        out = torch.empty(stop - start, cols, dtype=dtype)
        per = max(1, SLAB // cols)
        for r in range(start, stop, per):
            n = min(per, stop - r)
            out[r - start : r - start + n] = _decode(_read_rows(path, t.data_offset, row_bytes, r, n), t.tensor_type, cols)
        if heads is not None:
            out = _unpermute(out, heads)
        return out if len(shape) == 2 else out.reshape(shape)

    return read


def _grid_reader(t, path: str, shape: tuple[int, ...], heads: int | None, make):
    def read() -> Int4Grid | Int8Grid:
        grid = make(_read_rows(path, t.data_offset, int(t.n_bytes), 0, 1), *shape)
        if heads is None:
            return grid
        if isinstance(grid, Int4Grid):
            return Int4Grid(_unpermute(grid.codes, heads), _unpermute(grid.scale, heads), _unpermute(grid.zero, heads), 32)
        return Int8Grid(_unpermute(grid.codes, heads), _unpermute(grid.scale, heads))

    return read


KEPT = {"int4": ("Q4_1", "Q4_K"), "int8": ("Q8_0",)}  # the file types whose codes a precision keeps as stored


def layer_types(reader: GGUFFile) -> dict[str, int]:
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


_GRIDS = {"Q4_1": (Int4Grid, _q4_1_grid), "Q4_K": (Int4Grid, _q4_k_grid), "Q8_0": (Int8Grid, _q8_0_grid)}


def read_tensors(reader: GGUFFile, cfg: ModelConfig) -> tuple[LazyTensors, LazyGrids]:
    """Canonical tensors (HF orientation [out, in]) and the Q4_1 / Q4_K / Q8_0 grids of the matrices stored so,
    each read from the file when asked for (weights.py): nothing is decoded here."""
    path = reader.path
    tensors: dict = {}
    grids: dict = {}
    for t in reader.tensors:
        name = t.name
        if name in _TOP_NAMES:
            key = _TOP_NAMES[name]
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
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        heads = None
        if key.endswith((".q", ".k")) and cfg.arch in PERMUTED_ARCHS:
            heads = cfg.n_heads if key.endswith(".q") else cfg.n_kv_heads
        tensors[key] = (shape, _reader(t, path, shape, heads))
        if t.tensor_type.name in _GRIDS and len(shape) == 2:
            grid_kind, make = _GRIDS[t.tensor_type.name]
            grids[key] = (grid_kind, _grid_reader(t, path, shape, heads, make))
    return LazyTensors(tensors), LazyGrids(grids)

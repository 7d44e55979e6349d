"""GGUF's K-quants and the other types people download (issue 45 item 2).

Q4_K is Q4_1's form at group 32 under 6-bit scales and mins: its codes are kept exactly on the engine's int4
grid, checked against gguf.quants.dequantize as the oracle on random blocks (every byte pattern is a block).
Q4_K_M files mix Q4_K with Q6_K: the fused products keep the parts stored in Q4_K and re-quantize the rest.
Q4_0, Q5_0, Q5_1 and Q6_K are dequantized and quantized again; `specledger quality` says which was which.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import dequantize
from tests.engine.test_qwen import _prompts, save_qwen, write_qwen_gguf

from specledger.engine.gguf_loader import _q4_k_grid, grid_plan
from specledger.engine.loader import load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def random_q4_k(rows: int, cols: int, rng: np.random.Generator, d: float = 0.0002) -> np.ndarray:
    """Random Q4_K super-blocks (144 bytes each) with sane fp16 factors; any other byte is valid as it is."""
    raw = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
    lo, hi = sorted((0.5 * d, d))
    factors = np.stack([rng.uniform(lo, hi, (rows, cols // 256)),
                        rng.uniform(4 * lo, 8 * hi, (rows, cols // 256))], -1)  # d, dmin (w centred near 0)
    raw[..., 0:4] = factors.astype(np.float16).view(np.uint8).reshape(rows, cols // 256, 4)
    return raw.reshape(rows, -1)


def random_q6_k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q6_K super-blocks (210 bytes: ql 128, qh 64, int8 scales 16, fp16 d)."""
    raw = rng.integers(0, 256, size=(rows, cols // 256, 210), dtype=np.uint8)
    raw[..., 192:208] = rng.integers(-20, 20, (rows, cols // 256, 16)).astype(np.int8).view(np.uint8)
    raw[..., 208:210] = np.full((rows, cols // 256, 1), 1e-4, np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def dequantized_grid(g) -> torch.Tensor:
    n, k = g.codes.shape
    return ((g.codes.float() - 8).reshape(n, k // 32, 32) * g.scale[..., None] + g.zero[..., None]).reshape(n, k)


def test_q4_k_codes_equal_gguf_dequantize():
    rng = np.random.default_rng(0)
    for rows, cols, d in ((3, 256, 0.01), (5, 1024, 0.002), (2, 512, -0.003), (4, 256, 0.0002)):
        raw = random_q4_k(rows, cols, rng, d)
        want = dequantize(raw, T.Q4_K).reshape(rows, cols)
        g = _q4_k_grid(raw.reshape(-1), rows, cols)
        assert g.codes.max() <= 15 and g.group_size == 32
        np.testing.assert_allclose(dequantized_grid(g).numpy(), want, rtol=0, atol=1e-6 * np.abs(want).max())


HIDDEN = dict(hidden_size=256, intermediate_size=512, head_dim=64, initializer_range=0.02)


def kquant_file(tmp_path: Path, types: dict[str, T], default: T | None = T.Q4_K) -> Path:
    """A tiny qwen2 GGUF whose layer matrices are stored in the given types (by GGUF name part)."""
    rng = np.random.default_rng(1)

    def encode(name: str, w: np.ndarray):
        if not name.startswith("blk.") or w.ndim != 2:
            return None
        part = name.split(".")[2]
        kind = types.get(part, default)
        if kind is None:
            return None
        rows, cols = w.shape
        if kind == T.Q4_K:
            return random_q4_k(rows, cols, rng), kind
        if kind == T.Q6_K:
            return random_q6_k(rows, cols, rng), kind
        from gguf import quants

        return quants.quantize(w.astype(np.float32), kind), kind

    f = tmp_path / "k.gguf"
    write_qwen_gguf(f, save_qwen(tmp_path / "hf", "qwen2", **HIDDEN), "qwen2", encode)
    return f


def rel(f: Path, quant: str) -> tuple[float, float]:
    """The quantized engine against the file's own weights dequantized (fp32): relative error, top-1 agreement."""
    ids = torch.tensor([_prompts()[0] * 2])
    ref_lm, lm = load_model(str(f), with_tokenizer=False), load_model(str(f), with_tokenizer=False, quant=quant)
    ref = ref_lm.model(ids, ref_lm.model.new_cache(64))
    out = lm.model(ids, lm.model.new_cache(64)).float()
    assert ref.std() > 0.2
    return float((out - ref).norm() / ref.norm()), float((out.argmax(-1) == ref.argmax(-1)).float().mean())


def test_q4_k_file_keeps_its_codes_at_int4(tmp_path):
    """Kept codes: W4A16 differs from the file's own fp32 weights by the activations' rounding only (0.007 here);
    re-quantizing the dequantized weights to int4 g32 costs ten times that (0.07-0.09, the test below)."""
    err, top1 = rel(kquant_file(tmp_path, {}), "int4")
    assert err < 0.02 and top1 > 0.9


def test_q4_k_m_mix_keeps_the_q4_k_parts(tmp_path):
    """Q4_K_M's layout: V and down in Q6_K. The fused QKV keeps Q and K's own codes, V is re-quantized."""
    from specledger.engine import gguf_loader
    from specledger.engine.quant import Int4Linear, int4_grid

    f = kquant_file(tmp_path, {"attn_v": T.Q6_K, "ffn_down": T.Q6_K})
    lm = load_model(str(f), with_tokenizer=False, quant="int4")
    reader = gguf_loader.open_gguf(f)
    cfg = gguf_loader.read_config(reader, f)
    tensors, grids = gguf_loader.read_tensors(reader, cfg)
    assert "layers.0.q" in grids and "layers.0.v" not in grids
    parts = [grids["layers.0.q"], grids["layers.0.k"], int4_grid(tensors["layers.0.v"], 32)]
    from specledger.engine.loader import _concat_grids

    want = Int4Linear(_concat_grids(parts), torch.bfloat16, torch.device("cpu"))
    got = lm.model.layers[0].attention.wqkv
    assert all(torch.equal(getattr(got, b), getattr(want, b)) for b, _ in want.named_buffers())
    assert gguf_loader.layer_types(reader) == {"Q4_K": 10, "Q6_K": 4}


@pytest.mark.parametrize("kind", [T.Q4_0, T.Q5_0, T.Q5_1, T.Q6_K])
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_other_types_are_dequantized_and_requantized(tmp_path, kind, quant):
    f = kquant_file(tmp_path, {}, default=kind)
    err, top1 = rel(f, quant)
    assert err < (0.02 if quant == "int8" else 0.15)  # re-quantization's cost: what `specledger quality` reports
    kept, again = grid_plan(load_model(str(f), with_tokenizer=False, quant=quant).extra["layer_types"], quant, 32)
    assert kept == {} and again == {kind.name: 14}


def test_grid_plan_and_the_quality_note():
    from specledger.cli.engine import _weights_note

    types = {"Q5_0": 133, "Q8_0": 13, "Q6_K": 12, "Q4_K": 12, "F32": 121}
    assert grid_plan(types, "int4", 32) == ({"Q4_K": 12}, {"Q5_0": 133, "Q8_0": 13, "Q6_K": 12})
    assert grid_plan(types, "int4", 64)[0] == {}
    assert grid_plan(types, "int8", 32) == ({"Q8_0": 13}, {"Q5_0": 133, "Q6_K": 12, "Q4_K": 12})
    note = _weights_note(types, "int4", 32)
    assert note is not None and "Q4_K 12" in note["note"] and "re-quantized to int4 g32: Q5_0 133, Q6_K 12, Q8_0 13" in note["note"]
    assert _weights_note(types, "none", 32) is None and _weights_note(None, "int4", 32) is None


REAL = {"qwen2.5-coder-1.5b": (28, {"Q4_K": 168, "Q6_K": 28}), "qwen2.5-coder-0.5b": (24, {"Q5_0": 132, "Q8_0": 12,
                                                                                         "Q6_K": 12, "Q4_K": 12})}


@pytest.mark.parametrize("name", list(REAL))
def test_the_real_files_if_here(name):
    """The real pair, where `specledger models --fetch` has put it (never fetched by the tests): config, the layer
    matrices' types, and the first three Q4_K layer matrices decoded as gguf decodes them."""
    from specledger.engine import gguf_loader
    from specledger.engine.registry import KNOWN_MODELS, known_model_path

    path = known_model_path(KNOWN_MODELS[name])
    if path is None:
        pytest.skip(f"{name} is not here (specledger models --fetch {name}); the tests never download it")
    reader = gguf_loader.open_gguf(path)
    cfg = gguf_loader.read_config(reader, path)
    assert (cfg.arch, cfg.qkv_bias, cfg.qk_norm, cfg.n_layers) == ("qwen2", True, False, REAL[name][0])
    assert gguf_loader.layer_types(reader) == REAL[name][1]
    checked = 0
    for t in reader.tensors:
        if t.name.startswith("blk.") and t.tensor_type == T.Q4_K and checked < 3:
            rows, cols = (int(x) for x in reversed(t.shape.tolist()))
            want = dequantize(t.data, t.tensor_type).reshape(rows, cols)
            got = dequantized_grid(_q4_k_grid(np.asarray(t.data), rows, cols)).numpy()
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("activations", [16, 8])
def test_quality_command_reads_one_model_at_a_time(tmp_path, activations):
    """`specledger quality` loads the reference, reads the text, lets it go, then the candidate: same figures as
    both at once (teacher_forced_agreement), at either activation precision (--activations 8: W8A8)."""
    import json

    from typer.testing import CliRunner

    from specledger.cli import app
    from specledger.data import quality_text
    from specledger.quality.agreement import teacher_forced_agreement
    from tests.engine.test_hf_conformance import save_tokenizer

    d = save_qwen(tmp_path / "q", "qwen2", **HIDDEN)
    save_tokenizer(d)
    out = tmp_path / "a.json"
    r = CliRunner().invoke(app, ["quality", "--model", str(d), "--quant", "int8", "--activations", str(activations),
                                 "--json", str(out)])
    assert r.exit_code == 0, r.output
    got = json.loads(out.read_text())
    ref, cand = load_model(str(d)), load_model(str(d), quant="int8", activations=activations)
    assert cand.label.endswith("-a8") == (activations == 8)
    want = teacher_forced_agreement(ref, cand, ref.tokenizer.encode(quality_text()))
    assert got["tokens"] == want.tokens and got["reference"] == ref.label and got["candidate"] == cand.label
    assert abs(got["mean_kl"] - want.mean_kl) < 1e-6 and got["top1_agreement"] == want.top1_agreement
    assert "layer_weights" not in got  # (a directory has no file codes to keep)


# ---- read on demand (weights.py): never the whole file in fp32 ---------------------------------------------------

MIXED = {"attn_v": T.Q6_K, "ffn_down": T.Q8_0, "attn_output": T.Q5_0}  # beside Q4_K, F32 norms, biases and head


def decoded_whole(f: Path) -> dict[str, torch.Tensor]:
    """Every tensor decoded at once by gguf's own reader, as the loader read files before (the oracle)."""
    from gguf import GGUFReader

    from specledger.engine import gguf_loader

    reader = gguf_loader.open_gguf(f)
    keys = gguf_loader.read_tensors(reader, gguf_loader.read_config(reader, f))[0]
    out = {}
    for t, key in zip(GGUFReader(f).tensors, keys, strict=True):
        shape = [int(x) for x in reversed(t.shape.tolist())]
        out[key] = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), np.float32)).reshape(shape)
    return out


def test_the_header_and_tensors_read_as_gguf_reads_them(tmp_path, monkeypatch):
    """GGUFFile's fields and directory equal gguf.GGUFReader's; each tensor decoded a few rows at a time (slabs
    that split it unevenly) into fp32 or bf16, whole or by rows, equals gguf's decoding of the whole tensor."""
    from gguf import GGUFReader

    from specledger.engine import gguf_loader

    monkeypatch.setattr(gguf_loader, "SLAB", 300)
    f = kquant_file(tmp_path, MIXED)
    ours, theirs = gguf_loader.open_gguf(f), GGUFReader(f)
    assert {k: v.contents() for k, v in theirs.fields.items() if not k.startswith("GGUF.")} == {
        k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in ours.fields.items()}
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, a.shape.tolist(), a.n_bytes, a.data_offset) == (
            b.name, b.tensor_type, b.shape.tolist(), int(b.n_bytes), int(b.data_offset))
        assert np.array_equal(a.data, b.data)
    tensors, _ = gguf_loader.read_tensors(ours, gguf_loader.read_config(ours, f))
    want = decoded_whole(f)
    assert {t.tensor_type.name for t in ours.tensors} == {"F32", "Q4_K", "Q6_K", "Q8_0", "Q5_0"}
    for key, w in want.items():
        assert torch.equal(tensors[key], w), key
        assert torch.equal(tensors.read(key, torch.bfloat16), w.to(torch.bfloat16)), key
        if w.dim() == 2:
            assert torch.equal(tensors.read(key, torch.float32, slice(3, 40)), w[3:40]), key


@pytest.mark.parametrize("quant,dtype", [("int4", "bf16"), ("int8", "bf16"), ("none", "bf16"), ("none", "fp32")])
def test_a_model_read_on_demand_is_the_model_read_whole(tmp_path, monkeypatch, quant, dtype):
    """load_model (tensors decoded as the model is built, a slab at a time; grids unpacked where kept; the output
    layer quantized by rows) builds the model, bit for bit, that the file decoded whole into fp32 builds."""
    from specledger.engine import gguf_loader
    from specledger.engine.loader import build_model
    from specledger.engine.quant import Int8Linear

    monkeypatch.setattr(gguf_loader, "SLAB", 300)
    f = kquant_file(tmp_path, MIXED)
    lm = load_model(str(f), with_tokenizer=False, quant=quant, dtype=dtype)
    reader = gguf_loader.open_gguf(f)
    cfg = gguf_loader.read_config(reader, f)
    whole = build_model(cfg, decoded_whole(f), dict(gguf_loader.read_tensors(reader, cfg)[1]), dtype=dtype, quant=quant)
    got, want = dict(lm.model.state_dict()), dict(whole.state_dict())
    assert got.keys() == want.keys()
    for k in want:
        a, b = (t.to_dense() if t.is_mkldnn else t for t in (got[k], want[k]))
        assert a.dtype == b.dtype and torch.equal(a, b), k
    if quant != "none":  # the head quantized by rows equals it quantized whole
        head = Int8Linear(decoded_whole(f)["output"], torch.bfloat16)
        assert all(torch.equal(getattr(lm.model.output, b), t) for b, t in head.named_buffers())


@pytest.mark.parametrize("quant,dtype", [("int4", "bf16"), ("int8", "bf16"), ("none", "bf16")])
def test_no_kept_or_converted_matrix_is_decoded_to_fp32(tmp_path, monkeypatch, quant, dtype):
    """What the peak memory rests on: a matrix whose codes are kept is never decoded at all, one converted to
    16 bits never to fp32; only those quantized again are, one fused product at a time."""
    from specledger.engine.weights import LazyTensors

    reads: list[tuple[str, torch.dtype]] = []
    real = LazyTensors.read

    def read(self, key, dtype=torch.float32, rows=None):
        reads.append((key, dtype))
        return real(self, key, dtype, rows)

    monkeypatch.setattr(LazyTensors, "read", read)
    f = kquant_file(tmp_path, MIXED)  # q, k, gate, up Q4_K; v Q6_K; o Q5_0; down Q8_0
    load_model(str(f), with_tokenizer=False, quant=quant, dtype=dtype)
    layer = {k.split(".")[2]: d for k, d in reads if k.startswith("layers.0.") and k.split(".")[2] in
             ("q", "k", "v", "o", "gate", "up", "down")}
    fp32 = torch.float32
    if quant == "int4":
        assert layer == {"v": fp32, "o": fp32, "down": fp32}
    elif quant == "int8":
        assert layer == {"q": fp32, "k": fp32, "v": fp32, "o": fp32, "gate": fp32, "up": fp32}
    else:
        assert set(layer) == {"q", "k", "v", "o", "gate", "up", "down"} and fp32 not in layer.values()
    assert len([k for k, _ in reads]) == len({k for k, _ in reads})  # each tensor decoded once

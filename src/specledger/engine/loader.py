"""load_model(): a name or path -> a ready model with its tokenizer, at a dtype and quantization."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from specledger.engine import gguf_loader, hf_loader
from specledger.engine.config import ModelConfig
from specledger.engine.model import Transformer
from specledger.engine.packed_linear import pack_linears
from specledger.engine.quant import (ACTIVATIONS, BLOCK, QUANTS, Int4Grid, Int4Linear, Int8Grid, Int8Linear,
                                    check_group_size, int4_grid, int8_grid, use_activation_bits)
from specledger.engine.registry import identify_model
from specledger.engine.tokenizer import Tokenizer
from specledger.engine.weights import Grid, grid_of, read, shape
from specledger.errors import BadInput

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer | None
    config: ModelConfig
    name: str  # the model's identity (registry.identify_model): the registry name however it was given
    source: str  # the file or directory, absolute
    dtype: str
    quant: str
    group_size: int | None
    device: str
    weight_bytes: int
    load_s: float
    extra: dict = field(default_factory=dict)
    activations: int = 16  # bits inside the kernel's quantized products (quant.ACTIVATIONS)

    @property
    def label(self) -> str:
        q = "" if self.quant == "none" else f"-{self.quant}" + (f"g{self.group_size}" if self.quant == "int4" else "")
        return f"{self.name}:{self.dtype}{q}" + ("-a8" if self.activations == 8 else "")


FUSED = {"attention.wqkv": ["q", "k", "v"], "attention.wo": ["o"], "feed_forward.w13": ["gate", "up"],
         "feed_forward.w2": ["down"]}  # the engine's products and the checkpoint's matrices each one fuses


def parse_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise BadInput(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[dtype]


def default_dtype(quant: str) -> str:
    """Weight-only quantization means 16-bit activations (the packed kernels' fast path)."""
    return "fp32" if quant == "none" else "bf16"


def _concat_grids(grids: list) -> Int4Grid | None:
    if not all(isinstance(g, Int4Grid) for g in grids):
        return None
    return Int4Grid(
        torch.cat([g.codes for g in grids]),
        torch.cat([g.scale for g in grids]),
        torch.cat([g.zero for g in grids]),
        grids[0].group_size,
    )


def _concat_int8_grids(grids: list) -> Int8Grid | None:
    if not all(isinstance(g, Int8Grid) for g in grids):
        return None
    return Int8Grid(torch.cat([g.codes for g in grids]), torch.cat([g.scale for g in grids]))


def _fp32(tensors: Mapping[str, torch.Tensor], keys: list[str], dev: torch.device) -> torch.Tensor:
    return torch.cat([read(tensors, k, torch.float32) for k in keys]).to(dev)


def _quantized(tensors: Mapping[str, torch.Tensor], grids: Mapping[str, Grid], keys: list[str], quant: str,
               group_size: int, tdtype: torch.dtype, dev: torch.device) -> nn.Module:
    """One fused product quantized: each part's grid as the file stores it where the precision keeps it, the
    others quantized from their fp32 weights (grids are row-wise, so parts quantized apart equal the fused matrix
    quantized whole): a file that mixes types (Q4_K beside Q6_K, as Q4_K_M does) keeps the codes it can."""
    own: list[Grid | None] = [None] * len(keys)
    if quant == "int8":
        own = [grid_of(grids, k, Int8Grid) for k in keys]
    elif group_size == 32:
        own = [grid_of(grids, k, Int4Grid) for k in keys]
    if all(g is None for g in own):
        w = _fp32(tensors, keys, dev)
        return Int8Linear(w, tdtype, dev) if quant == "int8" else Int4Linear(int4_grid(w, group_size), tdtype, dev)
    make = int8_grid if quant == "int8" else lambda w: int4_grid(w, 32)
    parts = [g if g is not None else make(read(tensors, k, torch.float32).to(dev)) for g, k in zip(own, keys)]
    if quant == "int8":
        g8 = _concat_int8_grids(parts)
        assert g8 is not None
        return Int8Linear(g8, tdtype, dev)
    grid = _concat_grids(parts)
    assert grid is not None
    return Int4Linear(grid, tdtype, dev)


def _int8_head(tensors: Mapping[str, torch.Tensor], key: str, dev: torch.device) -> Int8Grid | torch.Tensor:
    """The output layer's Q8_0-style grid quantized a slab of rows at a time (row-wise, so equal to the whole
    matrix quantized at once), never holding the vocabulary's fp32 matrix; the fp32 matrix itself where its width
    is not blocks of 32 (Int8Linear quantizes it per channel)."""
    n, k = shape(tensors, key)
    if k % BLOCK:
        return read(tensors, key, torch.float32).to(dev)
    codes = torch.empty(n, k, dtype=torch.int8, device=dev)
    scale = torch.empty(n, k // BLOCK, dtype=torch.float32, device=dev)
    step = max(1, gguf_loader.SLAB // k)
    for r in range(0, n, step):
        g = int8_grid(read(tensors, key, torch.float32, slice(r, r + step)).to(dev))
        codes[r : r + step], scale[r : r + step] = g.codes, g.scale
    return Int8Grid(codes, scale)


def build_model(
    cfg: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    grids: Mapping[str, Int4Grid | Int8Grid] | None = None,
    *,
    dtype: str = "fp32",
    quant: str = "none",
    group_size: int = 32,
    device: str = "cpu",
    pack: bool = True,
    consume: bool = False,
) -> Transformer:
    """Assemble the engine's model from canonical tensors (fusing QKV and gate/up, then quantizing).

    tensors, grids: dicts, or the loaders' lazy mappings (weights.py), read here once each, a layer at a time,
    straight to the dtype each is kept in: neither the file's fp32 weights nor a 16-bit copy of a matrix that is
    quantized is ever held whole.
    pack: lay a CPU bf16 model's products out for oneDNN once (engine/packed_linear.py) where the host can.
    consume: drop each layer's tensors from `tensors` once placed (a caller's dict of tensors then frees them as
    the model is built)."""
    if quant not in QUANTS:
        raise BadInput(f"unknown quantization {quant!r} (choose from {', '.join(QUANTS)})")
    tdtype = parse_dtype(dtype)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' requested but no CUDA device is available")
    if quant == "int4":
        check_group_size(cfg.hidden_size, group_size, "the attention/MLP input")
        check_group_size(cfg.intermediate_size, group_size, "the MLP down projection")
    grids = grids or {}
    f32 = torch.float32
    if "rope_freqs" in tensors:
        cfg.rope_scaling = {"rope_type": "freq_factors", "factors": read(tensors, "rope_freqs", f32).tolist()}
    with torch.device("meta"):
        model = Transformer(cfg)
    head = "output" if "output" in tensors else "embed"
    # norm weights stay fp32: they act on the fp32 residual stream
    try:
        embed = read(tensors, "embed", tdtype).to(dev)
        model.tok_embeddings.load_state_dict({"weight": embed}, assign=True)
        model.norm.load_state_dict({"weight": read(tensors, "norm", f32).to(dev)}, assign=True)
        for i, block in enumerate(model.layers):
            # a layer at a time, placed (and packed) before the next is read: only the model is ever held whole
            p = f"layers.{i}"
            sd: dict[str, torch.Tensor] = {"attention_norm.weight": read(tensors, f"{p}.attn_norm", f32).to(dev),
                                           "ffn_norm.weight": read(tensors, f"{p}.ffn_norm", f32).to(dev)}
            if cfg.qkv_bias:
                sd["attention.bias"] = torch.cat([read(tensors, f"{p}.{x}_bias", tdtype) for x in "qkv"]).to(dev)
            if cfg.qk_norm:
                sd["attention.q_norm.weight"] = read(tensors, f"{p}.q_norm", f32).to(dev)
                sd["attention.k_norm.weight"] = read(tensors, f"{p}.k_norm", f32).to(dev)
            for mod, parts in FUSED.items():
                keys = [f"{p}.{x}" for x in parts]
                if quant == "none":
                    sd[f"{mod}.weight"] = torch.cat([read(tensors, k, tdtype) for k in keys]).to(dev)
                else:  # replaces the meta Linear: load_state_dict below leaves it in place
                    owner_name, attr = mod.split(".")
                    setattr(getattr(block, owner_name), attr, _quantized(tensors, grids, keys, quant, group_size, tdtype, dev))
            block.load_state_dict(sd, assign=True, strict=quant == "none")
            del sd
            if quant == "none" and pack:
                pack_linears(block)
            if consume:
                for key in [k for k in tensors if k.startswith(f"{p}.")]:
                    del tensors[key]  # type: ignore[attr-defined]
        if quant == "none":  # tied: the embedding itself in fp32, its own copy otherwise (as it always was)
            out = read(tensors, "output", tdtype).to(dev) if head == "output" else embed if tdtype == f32 else embed.clone()
            model.output.load_state_dict({"weight": out}, assign=True)
        else:
            # The output layer (the GGUF's Q8_0 embedding when tied) is kept at 8 bits in both modes, on the
            # file's own codes where it stores them so.
            g8 = grid_of(grids, head, Int8Grid)
            model.output = Int8Linear(g8 if g8 is not None else _int8_head(tensors, head, dev), tdtype, dev)
    except KeyError as exc:
        raise BadInput(f"model weights lack tensor {exc.args[0]}") from None
    model.set_compute_dtype(tdtype)
    model.init_rope(dev)
    unset = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:
        raise BadInput(f"model weights lack tensor {unset[0]}")
    if quant == "none" and pack:
        pack_linears(model)  # the output layer (the layers' are packed)
    return model.eval().requires_grad_(False)


def weight_bytes(model: nn.Module) -> int:
    seen = set()
    total = 0
    for t in list(model.parameters()) + [b for n, b in model.named_buffers() if not n.startswith("rope_")]:
        key = id(t) if t.is_mkldnn else t.data_ptr()  # oneDNN's packed tensors have no storage to share
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def activation_twin(lm: LoadedModel, bits: int) -> LoadedModel:
    """The same loaded weights at other activation bits (W4A16 <-> W4A8 of the same codes): new modules, every
    parameter and buffer shared, so a run holds the codes once for both arms (bench/shared_models.py)."""
    tensors = [*lm.model.parameters(), *lm.model.buffers()]
    model = copy.deepcopy(lm.model, {id(t): t for t in tensors})
    use_activation_bits(model, bits)
    return dataclasses.replace(lm, model=model, activations=bits, load_s=0.0)


def read_model_config(name_or_path: str) -> ModelConfig:
    """A model's shape from its file's header or config.json, no weights read (the roofline, the memory plan)."""
    path = identify_model(name_or_path).path
    if path.is_dir():
        return hf_loader.read_config(path)
    return gguf_loader.read_config(gguf_loader.open_gguf(path), path)


def load_model(
    name_or_path: str,
    *,
    dtype: str | None = None,
    quant: str = "none",
    group_size: int = 32,
    device: str = "cpu",
    max_seq_len: int | None = None,
    with_tokenizer: bool = True,
    pack: bool = True,
    activations: int = 16,
) -> LoadedModel:
    if quant not in QUANTS:
        raise BadInput(f"unknown quantization {quant!r} (choose from {', '.join(QUANTS)})")
    if activations not in ACTIVATIONS or (activations == 8 and quant == "none"):
        raise BadInput(f"activations {activations}: choose 16, or 8 with int4/int8 weights (got quant {quant!r})")
    dtype = dtype or default_dtype(quant)
    parse_dtype(dtype)
    if quant == "int4" and group_size not in (32, 64, 128, 256):
        check_group_size(0, group_size)
    t0 = time.perf_counter()
    ref = identify_model(name_or_path)
    path = ref.path
    grids: Mapping[str, Grid] = {}
    tensors: Mapping[str, torch.Tensor]
    extra: dict = {}
    if path.is_dir():
        cfg = hf_loader.read_config(path)
        tensors = hf_loader.read_tensors(path, cfg)
        tok = Tokenizer.from_dir(path, set(cfg.eos_ids)) if with_tokenizer else None
    else:
        reader = gguf_loader.open_gguf(path)
        cfg = gguf_loader.read_config(reader, path)
        tensors, grids = gguf_loader.read_tensors(reader, cfg)
        extra["layer_types"] = gguf_loader.layer_types(reader)
        tok = Tokenizer.from_gguf(path, set(cfg.eos_ids)) if with_tokenizer else None
    if tok is not None:
        for special in ("<|endoftext|>", "<|im_end|>", "<|eot_id|>"):
            tid = tok.hf.convert_tokens_to_ids(special)
            if isinstance(tid, int) and tid != tok.hf.unk_token_id and tid is not None and tid >= 0:
                if special != "<|endoftext|>" or not cfg.eos_ids:
                    tok.eos_ids.add(tid)
        cfg.eos_ids = sorted(tok.eos_ids)
    if max_seq_len:
        cfg.max_seq_len = min(cfg.max_seq_len, max_seq_len)
    model = build_model(cfg, tensors, grids, dtype=dtype, quant=quant, group_size=group_size, device=device,
                        pack=pack, consume=True)
    use_activation_bits(model, activations)
    return LoadedModel(
        model=model,
        tokenizer=tok,
        config=cfg,
        name=ref.name,
        source=str(path),
        dtype=dtype,
        quant=quant,
        group_size=group_size if quant == "int4" else None,
        device=device,
        weight_bytes=weight_bytes(model),
        load_s=time.perf_counter() - t0,
        extra=extra,
        activations=activations,
    )

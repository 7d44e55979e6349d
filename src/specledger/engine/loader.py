"""load_model(): a name or path -> a ready model with its tokenizer, at a dtype and quantization."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from specledger.engine import gguf_loader, hf_loader
from specledger.engine.config import ModelConfig
from specledger.engine.model import Transformer
from specledger.engine.packed_linear import pack_linears
from specledger.engine.quant import (QUANTS, Int4Grid, Int4Linear, Int8Grid, Int8Linear, check_group_size, int4_grid,
                                    int8_grid)
from specledger.engine.registry import identify_model
from specledger.engine.tokenizer import Tokenizer
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

    @property
    def label(self) -> str:
        q = "" if self.quant == "none" else f"-{self.quant}" + (f"g{self.group_size}" if self.quant == "int4" else "")
        return f"{self.name}:{self.dtype}{q}"


def parse_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise BadInput(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[dtype]


def default_dtype(quant: str) -> str:
    """Weight-only quantization means 16-bit activations (the packed kernels' fast path)."""
    return "fp32" if quant == "none" else "bf16"


def _own_or_quantized(grids: list, tensors: dict[str, torch.Tensor], layer: int, parts: list[str],
                      dev: torch.device, kind: type, make) -> list:
    """Each part's grid as the file stores it where it is of `kind`, else the part quantized by `make` (grids are
    row-wise, so parts quantized apart equal the fused product quantized whole): a file that mixes types (Q4_K
    beside Q6_K, as Q4_K_M does) keeps the codes of the parts it can."""
    return [g if isinstance(g, kind) else make(tensors[f"layers.{layer}.{x}"].to(dev)) for g, x in zip(grids, parts)]


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


def _fp32(tensors: dict[str, torch.Tensor], layer: int, parts: list[str], dev: torch.device) -> torch.Tensor:
    return torch.cat([tensors[f"layers.{layer}.{x}"] for x in parts]).to(dev)


def build_model(
    cfg: ModelConfig,
    tensors: dict[str, torch.Tensor],
    grids: dict[str, Int4Grid | Int8Grid] | None = None,
    *,
    dtype: str = "fp32",
    quant: str = "none",
    group_size: int = 32,
    device: str = "cpu",
    pack: bool = True,
    consume: bool = False,
) -> Transformer:
    """Assemble the engine's model from canonical tensors (fusing QKV and gate/up, then quantizing).

    pack: lay a CPU bf16 model's products out for oneDNN once (engine/packed_linear.py) where the host can.
    consume: drop each layer's tensors from `tensors` once fused or quantized (load_model's own dict), so a
    model's fp32 weights are held once, not twice, while it is built (a 1.5B model: 7 GB less at the peak)."""
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
    if "rope_freqs" in tensors:
        cfg.rope_scaling = {"rope_type": "freq_factors", "factors": tensors["rope_freqs"].tolist()}
    with torch.device("meta"):
        model = Transformer(cfg)
    sd: dict[str, torch.Tensor] = {"tok_embeddings.weight": tensors["embed"], "norm.weight": tensors["norm"]}
    sd["output.weight"] = tensors.get("output", tensors["embed"])
    fused: dict[str, list[str]] = {"attention.wqkv": ["q", "k", "v"], "attention.wo": ["o"], "feed_forward.w13": ["gate", "up"], "feed_forward.w2": ["down"]}
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        try:
            sd[f"{p}.attention_norm.weight"] = tensors[f"{p}.attn_norm"]
            sd[f"{p}.ffn_norm.weight"] = tensors[f"{p}.ffn_norm"]
            for mod, parts in fused.items():
                # in the compute dtype at once: an fp32 copy of every fused matrix would coexist with the sources
                sd[f"{p}.{mod}.weight"] = torch.cat([tensors[f"{p}.{x}"] for x in parts]).to(device=dev, dtype=tdtype)
            if cfg.qkv_bias:
                sd[f"{p}.attention.bias"] = torch.cat([tensors[f"{p}.{x}_bias"] for x in ("q", "k", "v")])
            if cfg.qk_norm:
                sd[f"{p}.attention.q_norm.weight"] = tensors[f"{p}.q_norm"]
                sd[f"{p}.attention.k_norm.weight"] = tensors[f"{p}.k_norm"]
            if consume and quant == "none":
                for key in [k for k in tensors if k.startswith(f"{p}.")]:
                    del tensors[key]
        except KeyError as exc:
            raise BadInput(f"model weights lack tensor {exc.args[0]}") from None
    # norm weights stay fp32: they act on the fp32 residual stream
    sd = {k: v.to(device=dev, dtype=torch.float32 if k.endswith("norm.weight") else tdtype) for k, v in sd.items()}
    model.load_state_dict(sd, assign=True)
    model.set_compute_dtype(tdtype)
    model.init_rope(dev)
    if quant != "none":
        for i, block in enumerate(model.layers):
            for mod, parts in fused.items():
                owner_name, attr = mod.split(".")
                owner = getattr(block, owner_name)
                # quantized from the fp32 source (not the compute-dtype copy), or the file's own codes
                src = [grids.get(f"layers.{i}.{x}") for x in parts]
                new: nn.Module
                if quant == "int8":
                    if any(isinstance(g, Int8Grid) for g in src):
                        src = _own_or_quantized(src, tensors, i, parts, dev, Int8Grid, int8_grid)
                    g8 = _concat_int8_grids(src)
                    new = Int8Linear(g8 if g8 is not None else _fp32(tensors, i, parts, dev), tdtype, dev)
                else:
                    if group_size == 32 and any(isinstance(g, Int4Grid) for g in src):
                        src = _own_or_quantized(src, tensors, i, parts, dev, Int4Grid, lambda w: int4_grid(w, 32))
                    grid = _concat_grids(src) if group_size == 32 else None
                    new = Int4Linear(grid or int4_grid(_fp32(tensors, i, parts, dev), group_size), tdtype, dev)
                setattr(owner, attr, new)
            if consume:  # this layer's fp32 sources are no longer needed (the output layer's are, below)
                for key in [k for k in tensors if k.startswith(f"layers.{i}.")]:
                    del tensors[key]
        # The output layer (the GGUF's Q8_0 embedding when tied) is kept at 8 bits in both modes, on the
        # file's own codes where it stores them so.
        head = grids.get("output") if "output" in tensors else grids.get("embed")
        if isinstance(head, Int8Grid):
            model.output = Int8Linear(Int8Grid(head.codes.to(dev), head.scale.to(dev)), tdtype)
        else:
            model.output = Int8Linear(tensors.get("output", tensors["embed"]).to(dev), tdtype)
    elif pack:
        pack_linears(model)
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
) -> LoadedModel:
    if quant not in QUANTS:
        raise BadInput(f"unknown quantization {quant!r} (choose from {', '.join(QUANTS)})")
    dtype = dtype or default_dtype(quant)
    parse_dtype(dtype)
    if quant == "int4" and group_size not in (32, 64, 128, 256):
        check_group_size(0, group_size)
    t0 = time.perf_counter()
    ref = identify_model(name_or_path)
    path = ref.path
    grids: dict[str, Int4Grid | Int8Grid] = {}
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
    )

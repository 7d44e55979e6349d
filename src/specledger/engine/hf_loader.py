"""Read a Hugging Face Llama-family directory (Llama, Mistral, Qwen2, Qwen3): config.json + safetensors, as
transformers reads them (the tensors memory-mapped, each read when the model is built).

The configuration goes through transformers' own AutoConfig, so every spelling it accepts (top-level
rope_theta/rope_scaling, the rope_parameters block, torch_dtype or dtype, ...) means what it means to
transformers. Whatever the engine does not implement is refused by name instead of being run wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specledger.engine.config import ModelConfig
from specledger.engine.weights import LazyTensors
from specledger.errors import BadInput, UnsupportedModel

# model_type -> the causal-LM class that transformers builds for it; both are the engine's decoder
# (Mistral is Llama with an optional sliding window, refused below when it applies; Qwen2 adds a Q/K/V bias,
# Qwen3 per-head Q/K norms instead).
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3")  # what engine/model.py rope_inv_freq implements
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_PARTS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.down_proj": "down",
    "self_attn.q_norm": "q_norm",  # Qwen3
    "self_attn.k_norm": "k_norm",
}
_BIASES = {"self_attn.q_proj": "q_bias", "self_attn.k_proj": "k_bias", "self_attn.v_proj": "v_bias"}  # Qwen2
_FIXED = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "output": "lm_head.weight"}
_FIXED_KEYS = {v: k for k, v in _FIXED.items()}  # the same, HF name -> engine key


def hf_config(path: Path):
    """The directory's configuration object exactly as transformers builds it (no remote code)."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # e.g. "torch_dtype is deprecated": the value is still honoured
    try:
        from huggingface_hub.errors import StrictDataclassError  # a field of the wrong type (transformers 5)
    except ImportError:  # pragma: no cover - an older huggingface_hub
        StrictDataclassError = TypeError  # type: ignore[misc, assignment]
    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as exc:
        # "Validation error for field 'hidden_size':" then "TypeError: Field 'hidden_size' expected int, got str"
        first = " ".join(x.strip() for x in str(exc).strip().splitlines()[:2]) or type(exc).__name__
        raise UnsupportedModel(f"{path / 'config.json'}: transformers cannot read it ({first})") from None
    finally:
        hf_logging.set_verbosity(level)


def _refuse(path: Path, what: str, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"{path / 'config.json'}: {what} is not supported ({why})")


def check_supported(c, path: Path) -> dict:
    """Refuse every setting the engine would silently run wrong; return the RoPE parameters."""
    archs = list(getattr(c, "architectures", None) or [])
    if c.model_type not in MODEL_TYPES:
        what = f"model_type={c.model_type!r}" + (f" ({', '.join(archs)})" if archs else "")
        raise _refuse(path, what, f"the engine runs the Llama family: {', '.join(MODEL_TYPES)}")
    if archs and MODEL_TYPES[c.model_type] not in archs:
        raise _refuse(path, f"architectures={archs}", f"expected {MODEL_TYPES[c.model_type]}")
    for name in ("attention_bias", "mlp_bias"):  # (Qwen2's Q/K/V bias is its architecture, not this flag)
        if getattr(c, name, False):
            raise _refuse(path, f"{name}=true", "the engine's linear layers have no bias (but Qwen2's Q/K/V)")
    if getattr(c, "hidden_act", "silu") != "silu":
        raise _refuse(path, f"hidden_act={c.hidden_act!r}", "the engine's MLP is SwiGLU (silu)")
    window = getattr(c, "sliding_window", None)
    if window is not None and window < c.max_position_embeddings:
        raise _refuse(path, f"sliding_window={window}", "the engine attends to the whole context")
    if getattr(c, "quantization_config", None):
        method = c.quantization_config.get("quant_method", "?") if isinstance(c.quantization_config, dict) else "?"
        raise _refuse(path, f"quantization_config (quant_method={method!r})", "load the unquantized weights")
    rope = dict(c.rope_parameters or {})
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ROPE_TYPES:
        raise _refuse(path, f"rope_type={kind!r}", f"supported: {', '.join(ROPE_TYPES)}")
    partial = rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        raise _refuse(path, f"partial_rotary_factor={partial}", "the engine rotates the whole head")
    if "rope_theta" not in rope:
        raise _refuse(path, "a RoPE configuration without rope_theta", "transformers gave no base frequency")
    return rope


def read_config(path: Path) -> ModelConfig:
    """The engine's ModelConfig from what transformers made of config.json (RoPE from rope_parameters)."""
    c = hf_config(path)
    rope = check_supported(c, path)
    kind = rope.get("rope_type") or rope.get("type") or "default"
    scaling = None if kind == "default" else {k: v for k, v in rope.items() if k != "rope_theta"} | {"rope_type": kind}
    n_heads = c.num_attention_heads
    eos = c.eos_token_id
    return ModelConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=c.num_key_value_heads or n_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // n_heads,
        max_seq_len=c.max_position_embeddings,
        rope_theta=float(rope["rope_theta"]),
        rms_eps=c.rms_norm_eps,
        tie_embeddings=bool(c.tie_word_embeddings),
        rope_scaling=scaling,
        eos_ids=eos if isinstance(eos, list) else ([eos] if eos is not None else []),
        arch=c.model_type if c.model_type in ("qwen2", "qwen3") else "llama",
        qkv_bias=c.model_type == "qwen2",
        qk_norm=c.model_type == "qwen3",
    )


def weight_files(path: Path) -> list[Path]:
    """The files transformers would read: the index's shards, else model.safetensors (nothing else)."""
    if (path / INDEX).exists():
        try:
            weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{path / INDEX}: cannot read its weight_map ({exc})") from None
        files = [path / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise BadInput(f"{path / INDEX} names shards that are missing: {', '.join(missing[:3])}")
        return files
    if (path / SINGLE).exists():
        return [path / SINGLE]
    raise BadInput(f"{path}: no {SINGLE} or {INDEX} (only safetensors weights are read)")


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab_size, h), "norm": (h,)}
    shapes["output"] = (cfg.vocab_size, h)  # optional when tied (see read_tensors)
    for n in range(cfg.n_layers):
        p = f"layers.{n}"
        shapes |= {
            f"{p}.attn_norm": (h,), f"{p}.ffn_norm": (h,), f"{p}.q": (cfg.n_heads * hd, h),
            f"{p}.k": (cfg.n_kv_heads * hd, h), f"{p}.v": (cfg.n_kv_heads * hd, h), f"{p}.o": (h, cfg.n_heads * hd),
            f"{p}.gate": (i, h), f"{p}.up": (i, h), f"{p}.down": (h, i),
        }
        if cfg.qkv_bias:
            shapes |= {f"{p}.q_bias": (cfg.n_heads * hd,), f"{p}.k_bias": (cfg.n_kv_heads * hd,),
                       f"{p}.v_bias": (cfg.n_kv_heads * hd,)}
        if cfg.qk_norm:
            shapes |= {f"{p}.q_norm": (hd,), f"{p}.k_norm": (hd,)}
    return shapes


def _hf_name(key: str) -> str:
    """The HF tensor name of an engine key (for messages)."""
    if key in _FIXED:
        return _FIXED[key]
    _, idx, part = key.split(".", 2)
    names, kind = (_BIASES, "bias") if part.endswith("_bias") else (_PARTS, "weight")
    return f"model.layers.{idx}.{next(k for k, v in names.items() if v == part)}.{kind}"


def _canonical(name: str) -> str | None:
    """The engine's name for an HF tensor name; None for tensors transformers recomputes (rotary inv_freq)."""
    if name in _FIXED_KEYS:
        return _FIXED_KEYS[name]
    stem, _, kind = name.rpartition(".")
    if name.startswith("model.layers.") and kind in ("weight", "bias"):
        idx, part = stem[len("model.layers.") :].split(".", 1)
        names = _PARTS if kind == "weight" else _BIASES
        if part in names and idx.isdigit():
            return f"layers.{idx}.{names[part]}"
    if "rotary_emb" in name:
        return None
    return ""


def _reader(handle, name: str):
    """A Reader (weights.py) of one tensor of an open safetensors file: a copy the caller owns, through fp32 (as
    the model was always built: fp16 -> fp32 -> bf16, never fp16 -> bf16 directly)."""

    def read(dtype: torch.dtype, rows: slice | None = None) -> torch.Tensor:
        w = handle.get_tensor(name) if rows is None else handle.get_slice(name)[rows]
        return w.clone() if w.dtype == dtype else w.float().to(dtype)

    return read


def read_tensors(path: Path, cfg: ModelConfig) -> LazyTensors:
    """Canonical tensors, each checked against the shape config.json implies (a bias only where the
    architecture has one: Llama's q_proj.bias is refused by name), read from the memory-mapped files only when
    the model is built (weights.py)."""
    from safetensors import safe_open

    expected = _expected_shapes(cfg)
    out: dict = {}
    for f in weight_files(path):
        handle = safe_open(str(f), framework="pt")
        for name in handle.keys():
            key = _canonical(name)
            if key is None:
                continue
            if key == "" or (key not in expected and key.endswith(("_bias", "_norm"))):
                raise UnsupportedModel(f"{f.name}: tensor {name} has no place in the engine's Llama decoder")
            meta = handle.get_slice(name)
            stored = meta.get_dtype()
            if not (stored.startswith("F") or stored == "BF16"):
                raise UnsupportedModel(f"{f.name}: tensor {name} is {stored} (quantized weights are not read)")
            shape = tuple(meta.get_shape())
            if key not in expected or shape != expected[key]:
                want = expected.get(key, "no such layer")
                raise BadInput(f"{f.name}: tensor {name} has shape {shape}; config.json implies {want}")
            out[key] = (shape, _reader(handle, name))
    # Tied and no lm_head.weight: the embedding is the output layer. Tied but a stored lm_head.weight that
    # differs: transformers 5 keeps the stored one (it ties only what the checkpoint leaves out), and so do we.
    missing = [k for k in expected if k not in out and not (k == "output" and cfg.tie_embeddings)]
    cfg.tie_embeddings = "output" not in out  # as for GGUF: tied means no separate output layer
    if missing:
        hint = " (tie_word_embeddings is false but there is no lm_head.weight)" if missing == ["output"] else ""
        raise BadInput(f"{path}: weights lack {len(missing)} tensor(s), first {_hf_name(missing[0])}{hint}")
    return LazyTensors(out)

"""Read a Hugging Face Llama-family directory: config.json + *.safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specledger.engine.config import ModelConfig
from specledger.errors import BadInput, UnsupportedModel

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
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
}


def read_config(path: Path) -> ModelConfig:
    try:
        c = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path / 'config.json'}: cannot read ({exc})") from None
    archs = c.get("architectures") or []
    if not any(a in SUPPORTED for a in archs) or c.get("attention_bias") or c.get("mlp_bias"):
        what = ", ".join(archs) or c.get("model_type", "?")
        raise UnsupportedModel(f"{path}: architecture {what} is not supported (supported: {', '.join(SUPPORTED[:1])} without biases)")
    n_heads = c["num_attention_heads"]
    eos = c.get("eos_token_id")
    return ModelConfig(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"],
        n_layers=c["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads", n_heads),
        head_dim=c.get("head_dim") or c["hidden_size"] // n_heads,
        max_seq_len=c.get("max_position_embeddings", 2048),
        rope_theta=c.get("rope_theta", 10000.0),
        rms_eps=c.get("rms_norm_eps", 1e-5),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        rope_scaling=c.get("rope_scaling"),
        bos_id=c.get("bos_token_id"),
        eos_ids=eos if isinstance(eos, list) else ([eos] if eos is not None else []),
    )


def read_tensors(path: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise BadInput(f"{path}: no *.safetensors weights found")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for name, w in load_file(str(f)).items():
            if name == "model.embed_tokens.weight":
                out["embed"] = w.float()
            elif name == "model.norm.weight":
                out["norm"] = w.float()
            elif name == "lm_head.weight":
                out["output"] = w.float()
            elif name.startswith("model.layers."):
                rest = name[len("model.layers.") :]
                idx, part = rest.split(".", 1)
                part = part.removesuffix(".weight")
                if part in _PARTS:
                    out[f"layers.{idx}.{_PARTS[part]}"] = w.float()
                elif "rotary_emb" not in part:
                    raise UnsupportedModel(f"{f.name}: unexpected tensor {name}")
    return out

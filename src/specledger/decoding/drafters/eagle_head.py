"""The EAGLE draft head: (token embedding, target feature) -> one decoder layer -> next feature.

Entry i of the head pairs f_i, the target's final-normed hidden state at position i, with
the embedding of token i+1, and predicts f_{i+1}; the target's own frozen LM head turns
that into the distribution of token i+2. Embeddings, LM head and RoPE tables are borrowed
from the target at call time, so the saved file holds only the head's own weights.

A head may carry a draft vocabulary (the ids of the tokens it may propose, as in EAGLE-3):
the LM head is then restricted to those rows, which makes every drafting step and every
training step several times cheaper on a CPU; verification is unchanged, so it stays lossless.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from torch import nn

from specledger.engine.config import ModelConfig
from specledger.engine.loader import LoadedModel
from specledger.engine.model import Block, RMSNorm, Transformer, kv_dtype, ragged_block
from specledger.engine.packed_linear import PackedLinear, pack
from specledger.engine.quant import Int8Linear
from specledger.engine.ragged import Segment, finish_pass, plan_pass, rope_at
from specledger.engine.slot_cache import SlotCache
from specledger.errors import BadInput

FORMAT = "specledger-eagle-head"


@dataclass
class HeadConfig:
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    target_name: str = ""
    target_vocab: int = 0
    target_hidden: int = 0
    attn_norm: bool = True  # public EAGLE-1 heads skip the first layer's input norm
    fc_bias: bool = True
    draft_vocab: int = 0  # size of the draft vocabulary; 0 = the target's whole vocabulary

    @classmethod
    def for_target(cls, lm: LoadedModel) -> "HeadConfig":
        """The head's layer has the target's layer shape (as in EAGLE)."""
        c = lm.config
        return cls(c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim, c.intermediate_size, c.rms_eps, c.rope_theta,
                   lm.name, c.vocab_size, c.hidden_size)

    def block_config(self) -> ModelConfig:
        return ModelConfig(self.target_vocab, self.hidden_size, self.intermediate_size, 1, self.n_heads,
                           self.n_kv_heads, self.head_dim, 0, self.rope_theta, self.rms_eps)


class _Cast(nn.Module):
    """In place of the input norm of heads that have none: hands the fp32 residual on in the compute dtype."""

    out_dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.out_dtype)


class EagleHead(nn.Module):
    draft_vocab: torch.Tensor | None  # a buffer (register_buffer below): the draft vocabulary's target ids

    def __init__(self, cfg: HeadConfig, draft_vocab: torch.Tensor | None = None) -> None:
        super().__init__()
        if draft_vocab is not None:
            cfg = replace(cfg, draft_vocab=int(draft_vocab.numel()))
        elif cfg.draft_vocab:
            draft_vocab = torch.zeros(cfg.draft_vocab, dtype=torch.long)  # filled by load_state_dict
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=cfg.fc_bias)
        self.block = Block(cfg.block_config())
        if not cfg.attn_norm:
            self.block.attention_norm = _Cast()
        self.register_buffer("draft_vocab", None if draft_vocab is None else draft_vocab.long().clone())

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def set_dtype(self, dtype: torch.dtype) -> "EagleHead":
        """Weights and compute in `dtype`; the norms hand on in it too (the residual stream stays fp32)."""
        self.to(dtype)
        for m in self.modules():
            if isinstance(m, RMSNorm):  # norm weights act on the fp32 residual stream
                m.weight.data = m.weight.data.float()
            if isinstance(m, (RMSNorm, _Cast)):
                m.out_dtype = dtype
        return self

    def check_target(self, lm: LoadedModel) -> None:
        """A head only makes sense on features and a vocabulary of the shape it was trained on."""
        c = self.cfg
        if (c.target_hidden, c.target_vocab) != (lm.config.hidden_size, lm.config.vocab_size):
            raise BadInput(
                f"EAGLE head for {c.target_name or 'another model'} (hidden {c.target_hidden}, vocab {c.target_vocab}) "
                f"does not fit target {lm.label} (hidden {lm.config.hidden_size}, vocab {lm.config.vocab_size})"
            )

    def inputs(self, base: Transformer, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The layer's input, fc(embedding of tokens (B, n), features (B, n, H)): the fp32 residual, as in the base."""
        emb = base.tok_embeddings(tokens).to(self.dtype)
        return self.fc(torch.cat([emb, features.to(self.dtype)], dim=-1)).float()

    def new_slot_cache(self, n_slots: int, max_len: int, device: torch.device | str = "cpu") -> SlotCache:
        """The head's cache for many sequences (one slot each), as the batched drafter keeps it."""
        c = self.cfg
        dev = torch.device(device)
        return SlotCache(1, c.n_kv_heads, c.head_dim, n_slots, max_len, dtype=kv_dtype(self.dtype, dev), device=dev,
                         initial_len=min(max_len, 256))

    def ragged(self, base: Transformer, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
               segments: list[Segment], cache: SlotCache) -> torch.Tensor:
        """The head over many sequences in one pass: rows (N,) of tokens with their (N, H) features at RoPE
        positions (N,), grouped into segments, each appended to its slot under its mask (engine/ragged.py)."""
        plan = plan_pass(segments, cache, tokens.device)
        cos, sin = rope_at(base.rope_cos, base.rope_sin, positions, self.dtype)
        x = ragged_block(self.block, 0, self.inputs(base, tokens[None], features[None]), cos, sin, plan, cache)
        finish_pass(plan, cache)
        return x[0].to(self.dtype)


class _Rows(nn.Module):
    """An LM head used as is: the draft vocabulary's columns of its logits, inputs cast to its dtype."""

    def __init__(self, out: nn.Module, ids: torch.Tensor | None, in_dtype: torch.dtype) -> None:
        super().__init__()
        self.out, self.ids, self.in_dtype = out, ids, in_dtype

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        y = self.out(h.to(self.in_dtype))
        return y if self.ids is None else y.index_select(-1, self.ids.to(h.device))


def draft_lm_head(head: EagleHead, base: Transformer) -> Callable[[torch.Tensor], torch.Tensor]:
    """The target's frozen LM head, restricted to the head's draft vocabulary, taking the head's dtype.

    The copy of the rows is not a submodule, so never saved; the EAGLE strategy keeps it in the model pool
    (eagle.pooled_lm_head) rather than building it per generation.
    """
    out, ids = base.output, head.draft_vocab
    if ids is None and base.dtype == head.dtype:
        return out
    if ids is not None:
        ids = ids.to(base.device)
    sub: nn.Module
    if isinstance(out, (nn.Linear, PackedLinear)):
        w = out.weight.detach() if ids is None else out.weight.detach().index_select(0, ids)
        linear = nn.Linear(out.in_features, w.shape[0], bias=False, device=base.device, dtype=head.dtype)
        linear.weight = nn.Parameter(w.to(head.dtype).clone(), requires_grad=False)
        sub = pack(linear) or linear  # a CPU bf16 product on oneDNN's layout or the engine's kernel, as the target's
    elif isinstance(out, Int8Linear) and ids is not None:  # the same codes and scales, fewer rows
        sub = _Rows(out.select_rows(ids), None, out.act_dtype)
    else:
        sub = _Rows(out, ids, base.dtype)
    return sub


# --- saving and loading -------------------------------------------------------------------------


def save_head(head: EagleHead, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """A directory with model.safetensors (the head's own weights only) and config.json."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous() for k, v in head.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"))
    (out / "model.safetensors").chmod(0o644)  # a file to ship, readable like the rest of the package
    cfg = {"format": FORMAT, **asdict(head.cfg), "dtype": str(dtype).removeprefix("torch.")}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    st = path / "model.safetensors"
    if not st.exists():
        found = sorted(path.glob("*.safetensors"))
        st = found[0] if len(found) == 1 else st
    if st.exists():
        from safetensors.torch import load_file

        return load_file(str(st))
    bin_ = path / "pytorch_model.bin"
    if bin_.exists():
        return torch.load(bin_, map_location="cpu", weights_only=True)
    raise BadInput(f"{path}: no model.safetensors or pytorch_model.bin in the EAGLE head directory")


def _public_config(c: dict, sd: dict[str, torch.Tensor]) -> HeadConfig:
    try:
        h, nh = int(c["hidden_size"]), int(c["num_attention_heads"])
        return HeadConfig(
            hidden_size=h,
            n_heads=nh,
            n_kv_heads=int(c.get("num_key_value_heads") or nh),
            head_dim=int(c.get("head_dim") or h // nh),
            intermediate_size=int(c["intermediate_size"]),
            rms_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(c.get("rope_theta", 10000.0)),
            target_name=str(c.get("_name_or_path", "")),
            target_vocab=int(c["vocab_size"]),
            target_hidden=h,
            attn_norm="layers.0.input_layernorm.weight" in sd,
            fc_bias="fc.bias" in sd,
        )
    except KeyError as exc:
        raise BadInput(f"EAGLE head config.json lacks {exc.args[0]!r}") from None


def _public_state(sd: dict[str, torch.Tensor], cfg: HeadConfig) -> dict[str, torch.Tensor]:
    """Public EAGLE names (fc, layers.0.self_attn.q_proj, ...) -> this module's (fused QKV, gate/up)."""
    p = "layers.0."
    extra = [k for k in sd if k.startswith("layers.") and not k.startswith(p)]
    if extra:
        raise BadInput(f"EAGLE heads with more than one decoder layer are not supported (found {extra[0]})")
    try:
        out = {
            "fc.weight": sd["fc.weight"],
            "block.attention.wqkv.weight": torch.cat([sd[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]),
            "block.attention.wo.weight": sd[p + "self_attn.o_proj.weight"],
            "block.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
            "block.feed_forward.w13.weight": torch.cat([sd[p + f"mlp.{x}_proj.weight"] for x in ("gate", "up")]),
            "block.feed_forward.w2.weight": sd[p + "mlp.down_proj.weight"],
        }
    except KeyError as exc:
        raise BadInput(f"EAGLE head weights lack tensor {exc.args[0]!r}") from None
    if cfg.fc_bias:
        out["fc.bias"] = sd["fc.bias"]
    if cfg.attn_norm:
        out["block.attention_norm.weight"] = sd[p + "input_layernorm.weight"]
    emb = sd.get("embed_tokens.weight")
    if emb is not None and tuple(emb.shape) != (cfg.target_vocab, cfg.target_hidden):
        want = (cfg.target_vocab, cfg.target_hidden)
        raise BadInput(f"EAGLE head embed_tokens has shape {tuple(emb.shape)}, config says {want}")
    return out


def load_head(path: str | Path, target: LoadedModel | None = None, dtype: torch.dtype | None = None) -> EagleHead:
    """Load a head saved by save_head, or one in the public EAGLE layout; check it fits `target` (and put it on
    the target's device)."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise BadInput(f"{path}: not an EAGLE head directory (no config.json)")
    try:
        c = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path / 'config.json'}: cannot read ({exc})") from None
    sd = _read_weights(path)
    if c.get("format") == FORMAT:
        cfg = HeadConfig(**{f.name: c[f.name] for f in fields(HeadConfig) if f.name in c})
    else:
        sd = {k.removeprefix("model."): v for k, v in sd.items()}
        if "fc.weight" not in sd or any(k.startswith("midlayer.") for k in sd):
            raise BadInput(f"{path}: not an EAGLE(-1/2) head (expected fc.* and layers.0.* weights)")
        cfg = _public_config(c, sd)
        if tuple(sd["fc.weight"].shape) != (cfg.hidden_size, 2 * cfg.hidden_size):
            got, want = tuple(sd["fc.weight"].shape), (cfg.hidden_size, 2 * cfg.hidden_size)
            raise BadInput(f"{path}: fc.weight has shape {got}, expected {want}")
        sd = _public_state(sd, cfg)
    head = EagleHead(cfg)
    try:
        head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()})
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise BadInput(f"{path}: head weights do not match its config ({first[-1].strip() if first else exc})") from None
    if head.draft_vocab is not None and (head.draft_vocab.numel() == 0 or int(head.draft_vocab.max()) >= cfg.target_vocab):
        raise BadInput(f"{path}: draft vocabulary holds ids outside the target vocabulary of {cfg.target_vocab}")
    head.set_dtype(dtype or (target.model.dtype if target is not None else torch.float32))
    if target is not None:
        head.check_target(target)
        head.to(target.model.device)
    return head.eval().requires_grad_(False)


def shipped_head_dir(model_name: str) -> Path:
    """Where the package keeps the trained head for an embedded model."""
    return Path(__file__).resolve().parents[2] / "data" / "heads" / model_name  # specledger/data

"""Does specledger read a model the way transformers does? A teacher-forced comparison of the two.

The lossless gate compares the engine with itself, so a model read wrong (a RoPE base, a scaling rule)
passes it; only an outside reference can catch that. This runs both on the same tokens in fp32.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch

from specledger.engine.loader import LoadedModel, load_model
from specledger.engine.registry import resolve_model
from specledger.errors import BadInput, SpecLedgerError

DEFAULT_ATOL = 1e-2  # fp32 with different kernels stays orders of magnitude below this; a misread model does not


@dataclass
class Conformance:
    source: str
    tokens: int
    token_source: str  # "tokenizer" (the built-in text) or "random" (the directory has no tokenizer)
    max_abs_diff: float  # over every position and vocabulary entry
    top1_agreement: float  # share of positions where both argmaxes are equal
    atol: float

    @property
    def ok(self) -> bool:
        # within atol, argmaxes can only differ on near-ties, so top-1 agreement is reported, not judged
        return self.max_abs_diff <= self.atol

    @property
    def verdict(self) -> str:
        if self.ok:
            return f"MATCH: specledger reads {self.source} as transformers does (max |Δlogit| ≤ {self.atol:g})"
        return (
            f"MISMATCH: specledger and transformers disagree on {self.source} (max |Δlogit| {self.max_abs_diff:.3g} > "
            f"{self.atol:g}): every figure measured on this model would be on a different model"
        )


def transformers_model(path: Path):
    """The model as transformers itself loads it, in fp32 (a GGUF file is dequantized by transformers)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        if path.is_dir():
            return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BadInput(f"transformers cannot load {path} for the comparison ({first[:300]})") from None
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def check_ids(lm: LoadedModel, n_tokens: int, seed: int = 0) -> tuple[list[int], str]:
    """Real text when the model has a tokenizer; otherwise seeded random ids (the comparison still holds)."""
    from specledger.data import quality_text

    if lm.tokenizer is not None:
        ids = lm.tokenizer.encode(quality_text())[:n_tokens]
        if len(ids) >= 2:
            return ids, "tokenizer"
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, lm.config.vocab_size, (n_tokens,), generator=g).tolist(), "random"


def check_model(name_or_path: str, n_tokens: int = 64, atol: float = DEFAULT_ATOL) -> Conformance:
    """Teacher-forced fp32 logits of specledger and transformers on the same ids."""
    if n_tokens < 2:
        raise BadInput(f"--tokens {n_tokens}: need at least 2 tokens to compare")
    path = resolve_model(name_or_path)
    try:
        lm = load_model(name_or_path, dtype="fp32")
    except BadInput as exc:
        if "tokenizer" not in str(exc):
            raise
        lm = load_model(name_or_path, dtype="fp32", with_tokenizer=False)
    ids, token_source = check_ids(lm, min(n_tokens, lm.config.max_seq_len))
    x = torch.tensor([ids])
    with torch.inference_mode():
        ours = lm.model(x, lm.model.new_cache(len(ids)))[0].float()
    del lm  # one fp32 model in memory at a time (a 1.5B model is 7 GB in fp32)
    gc.collect()
    hf = transformers_model(path)
    with torch.inference_mode():
        try:
            ref = hf(x).logits[0].float()
        except (RuntimeError, IndexError) as exc:  # e.g. a vocabulary transformers sizes differently
            raise SpecLedgerError(f"transformers failed on {path}: {str(exc).splitlines()[0][:300]}") from None
    if ref.shape != ours.shape:
        raise SpecLedgerError(f"{path}: transformers gives logits {tuple(ref.shape)}, specledger {tuple(ours.shape)}")
    return Conformance(
        source=str(path),
        tokens=len(ids),
        token_source=token_source,
        max_abs_diff=(ref - ours).abs().max().item(),
        top1_agreement=(ref.argmax(-1) == ours.argmax(-1)).float().mean().item(),
        atol=atol,
    )

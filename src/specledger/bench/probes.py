"""Measurements of a target model itself, taken once per run beside the requests.

- The verification-cost curve: forward time of n new tokens on top of a cached context, one sequence alone. The
  cost of a speculative step is (d·T_draft + T_verify(n)) / τ, so how T_verify grows with n says whether a tree
  can pay on this model, precision and device; the report plots it as a description of the target. No decision
  reads it: the planner prices each step's drafts on its own cost surface (decoding/sizing/planner.py), measured
  on ragged passes of a batch and refitted to the scheduler's passes as it runs.
- Teacher-forced agreement with the unquantized model (top-1 agreement, KL, perplexity): what the
  quantization gate judges, so a cheaper precision that is no longer the same model is marked as
  not comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specledger.records.config import BenchConfig

UNQUANTIZED = ("fp32", "none")  # (dtype, quant) of the reference the quantization gate compares with
AGREEMENT_TOKENS = 1024  # of the quality text, teacher-forced


def measure_verify_curve(lm: Any) -> list[dict[str, float]]:
    """[{tokens, ms}]: the median forward time of n new tokens after 256 cached ones, for n in
    engine.timing.CURVE_SIZES."""
    from specledger.engine.timing import CURVE_SIZES, forward_time_curve

    curve = forward_time_curve(lm, context=256, sizes=CURVE_SIZES, reps=5)
    return [{"tokens": n, "ms": round(1000 * s, 3)} for n, s in curve.items()]


def needs_agreement(bc: BenchConfig) -> bool:
    """In-process targets other than the unquantized fp32 model are checked against it."""
    return bc.backend == "inprocess" and (bc.dtype, bc.quant) != UNQUANTIZED


@dataclass
class ReferenceLogprobs:
    """The fp32 reference's teacher-forced log-probabilities over the quality text: all the quantization gate needs
    of it, so its weights are read once before a run loads its arms and released (the 1.5B at fp32 is 6.2 GB)."""

    label: str
    ids: list[int]
    logprobs: Any  # torch.Tensor (len(ids), vocab), fp32 on the CPU


def agreement_ids(lm: Any, text: str | None = None, max_tokens: int = AGREEMENT_TOKENS) -> list[int]:
    from specledger.data import quality_text

    ids = lm.tokenizer.encode(text if text is not None else quality_text())[:max_tokens]
    return ids[: lm.config.max_seq_len]


def reference_logprobs(reference: Any, text: str | None = None, max_tokens: int = AGREEMENT_TOKENS
                       ) -> ReferenceLogprobs:
    from specledger.quality.agreement import logprobs

    ids = agreement_ids(reference, text, max_tokens)
    return ReferenceLogprobs(getattr(reference, "label", reference.name), ids, logprobs(reference, ids))


def measure_agreement(reference: Any, candidate: Any, text: str | None = None,
                      max_tokens: int = AGREEMENT_TOKENS) -> dict:
    """Teacher-forced figures of `candidate` vs `reference` (a model, or its ReferenceLogprobs) over a fixed text
    (the package's quality text)."""
    from specledger.quality.agreement import agreement_of, logprobs

    ref = reference if isinstance(reference, ReferenceLogprobs) else reference_logprobs(reference, text, max_tokens)
    ids = ref.ids[: candidate.config.max_seq_len]
    a = agreement_of(ref.logprobs[: len(ids)], logprobs(candidate, ids), ids)
    a.mean_kl = max(0.0, a.mean_kl)  # identical distributions can round to -1e-15
    return {"reference": ref.label, "candidate": getattr(candidate, "label", ""), **a.as_dict()}

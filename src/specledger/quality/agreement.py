"""Teacher-forced comparison of a candidate model (quantized, lower precision) with a reference.

Both read the same text; at every position we compare their next-token distributions.
This is what says whether two precisions of a model are the same model for a workload.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from specledger.engine.loader import LoadedModel


@dataclass
class Agreement:
    tokens: int
    top1_agreement: float  # share of positions where both argmaxes are equal
    mean_kl: float  # mean KL(reference || candidate), nats
    ppl_reference: float
    ppl_candidate: float

    def as_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def next_token_logits(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Teacher-forced: the model's logits for the token after each prefix of ids (len(ids), vocab), on its device."""
    x = torch.tensor([ids], device=lm.model.device)
    return lm.model(x, lm.model.new_cache(len(ids)))[0]


@torch.inference_mode()
def logprobs(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Teacher-forced next-token log-probabilities (len(ids), vocab), fp32 on the CPU: normalised in place, a block
    of rows at a time, so the logits' one copy is all it holds (1024 x 151,936 for Qwen: 622 MB)."""
    lp = next_token_logits(lm, ids).float().cpu()
    for rows in lp.split(128):
        rows.sub_(rows.logsumexp(-1, keepdim=True))
    return lp


def top1_agreement(top_a: torch.Tensor, top_b: torch.Tensor) -> float:
    """The share of positions where two models' teacher-forced next tokens (argmax ids, any devices) are the same:
    the quantization gate's figure here, and a draft model's prior acceptance (drafters/hierarchy.agreement_prior)."""
    return float((top_a.cpu() == top_b.cpu()).float().mean())


def teacher_forced_agreement(reference: LoadedModel, candidate: LoadedModel, ids: list[int]) -> Agreement:
    ids = ids[: min(reference.config.max_seq_len, candidate.config.max_seq_len)]
    return agreement_of(logprobs(reference, ids), logprobs(candidate, ids), ids)


def agreement_of(lp_r: torch.Tensor, lp_c: torch.Tensor, ids: list[int]) -> Agreement:
    """The comparison from both models' log-probabilities on ids (so the two need not be in memory at once)."""
    agree = top1_agreement(lp_r.argmax(-1), lp_c.argmax(-1))
    kl = (lp_r.exp() * (lp_r - lp_c)).sum(-1).mean().item()
    nxt = torch.tensor(ids[1:])
    nll_r = -lp_r[:-1].gather(1, nxt[:, None]).mean().item()
    nll_c = -lp_c[:-1].gather(1, nxt[:, None]).mean().item()
    return Agreement(len(ids), agree, kl, float(torch.tensor(nll_r).exp()), float(torch.tensor(nll_c).exp()))

"""Sampling parameters and the target distribution they define (temperature, top-k, top-p)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specledger.errors import BadInput


@dataclass
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = 0
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise BadInput(f"max_tokens must be >= 1 (got {self.max_tokens})")
        if self.temperature < 0:
            raise BadInput(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise BadInput(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise BadInput(f"top_k must be >= 0 (got {self.top_k})")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def generator(self) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else torch.seed())
        return g


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from: every verifier compares against exactly this."""
    x = logits.float() / max(sp.temperature, 1e-6)
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = cum - sorted_p > sp.top_p  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs.float().cpu(), 1, generator=gen))

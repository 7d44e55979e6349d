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
        probs = nucleus(probs, sp.top_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


PROBE = 1024  # the likeliest tokens ranked first when cutting top_p (a nucleus rarely reaches further)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs outside the top_p nucleus zeroed: the likeliest tokens, equal ones in token order, each kept while the
    mass before it is at most top_p. Ranked among the PROBE likeliest where the cut falls clearly inside them,
    else by a full sort (~5 ms a step on a 151,936-word vocabulary); the two agree bit for bit (tests: the CPU)."""
    v = probs.shape[-1]
    if PROBE < v:
        top = probs.topk(PROBE, dim=-1).values  # largest first: the sorted vocabulary's first PROBE values
        before = top.cumsum(-1) - top
        keep = before <= top_p
        n_keep = keep.sum(-1, keepdim=True)
        prefix = torch.equal(keep, torch.arange(PROBE, device=probs.device) < n_keep)
        # the rest are dropped too when the first dropped token's mass before it clears top_p beyond rounding
        if prefix and bool((n_keep < PROBE).all()) and bool((before.gather(-1, n_keep) > top_p + 1e-6).all()):
            edge = top.gather(-1, n_keep - 1)  # the least probability kept; ties at it go in token order
            above, tied = probs > edge, probs == edge
            keep_all = above | (tied & (tied.cumsum(-1) <= n_keep - above.sum(-1, keepdim=True)))
            return probs.masked_fill(~keep_all, 0.0)
    sorted_p, idx = probs.sort(dim=-1, descending=True, stable=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs.float().cpu(), 1, generator=gen))

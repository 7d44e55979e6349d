"""Draft-model speculation: a chain of k tokens from a smaller (or quantized) model."""

from __future__ import annotations

import torch

from specledger.decoding.cached_model import CachedModel
from specledger.decoding.sampling import probs_from_logits, sample
from specledger.decoding.strategy import Context, StepStats, Strategy, clock
from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput


def check_same_tokenizer(a: LoadedModel, b: LoadedModel) -> None:
    """Levels exchange token ids, so their vocabularies must be the same, id for id."""
    if a.config.vocab_size != b.config.vocab_size:
        raise BadInput(
            f"incompatible tokenizers: {a.label} has {a.config.vocab_size} tokens, {b.label} has {b.config.vocab_size}"
        )
    if a.tokenizer is not None and b.tokenizer is not None and a.tokenizer.hf.get_vocab() != b.tokenizer.hf.get_vocab():
        raise BadInput(f"incompatible tokenizers: {a.label} and {b.label} map tokens to different ids")


def draft_chain(runner: CachedModel, k: int, ctx: Context) -> tuple[list[int], list[torch.Tensor] | None]:
    """k autoregressive steps of a drafter; its distributions are kept when sampling."""
    tokens: list[int] = []
    qs: list[torch.Tensor] | None = None if ctx.sp.greedy else []
    for _ in range(k):
        fwd = runner.forward()
        logits = fwd.logits[-1]
        if ctx.sp.greedy:
            tok = int(logits.argmax())
        else:
            q = probs_from_logits(logits, ctx.sp).cpu()
            tok = sample(q, ctx.gen)
            qs.append(q)
        runner.accept(fwd, [], [tok])
        tokens.append(tok)
    return tokens, qs


class DraftModel(Strategy):
    name = "draft"
    level_names = ["draft"]

    def __init__(self, target: LoadedModel, draft: LoadedModel, num_tokens: int = 4) -> None:
        super().__init__(target)
        check_same_tokenizer(target, draft)
        if not 1 <= num_tokens <= 64:
            raise BadInput(f"draft num_tokens must be in 1..64 (got {num_tokens})")
        self.draft_lm, self.k = draft, num_tokens
        self.lookahead = num_tokens

    def params(self) -> dict:
        return {"num_tokens": self.k, "draft": self.draft_lm.label}

    def start(self, ctx: Context) -> None:
        self.runner = CachedModel(self.draft_lm, ctx.target.max_len)
        self.runner.prefill(ctx.prompt)

    def step(self, ctx: Context) -> StepStats:
        dev = ctx.target.device
        t0 = clock(dev)
        self.runner.sync(ctx.target.tokens)
        tokens, qs = draft_chain(self.runner, min(self.k, ctx.budget()), ctx)
        t1 = clock(dev)
        new, _, verdict = self.verify_and_accept(ctx, Tree.chain(tokens, qs))
        return StepStats(len(new), [len(tokens)], [len(verdict.path)], [t1 - t0], clock(dev) - t1)

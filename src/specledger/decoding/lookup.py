"""Prompt lookup: propose the continuation of the latest earlier occurrence of the last n-gram."""

from __future__ import annotations

from specledger.decoding.strategy import Context, StepStats, Strategy, clock
from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput


def find_continuation(tokens: list[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Longest n-gram first; the most recent match wins (it tends to continue best)."""
    n_tok = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n_tok <= n:
            continue
        pattern = tokens[-n:]
        first = pattern[0]
        for i in range(n_tok - n - 1, -1, -1):
            if tokens[i] == first and tokens[i : i + n] == pattern:
                return tokens[i + n : i + n + k]
    return []


class PromptLookup(Strategy):
    name = "lookup"
    level_names = ["lookup"]

    def __init__(
        self, target: LoadedModel, num_tokens: int | None = None, max_ngram: int = 3, min_ngram: int = 1
    ) -> None:
        """num_tokens default: 3 on CPU, 10 elsewhere. On the CPU targets measured, verifying a 10-token
        chain cost more than its extra accepted tokens gained (fp32 1.00x, W4A16 0.68x of autoregressive
        at 10; 1.19x and 1.14x at 3; BENCHMARKS.md)."""
        super().__init__(target)
        if num_tokens is None:
            num_tokens = 3 if target.model.device.type == "cpu" else 10
        if not 1 <= min_ngram <= max_ngram:
            raise BadInput(f"lookup n-gram sizes need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram})")
        if not 1 <= num_tokens <= 128:
            raise BadInput(f"lookup num_tokens must be in 1..128 (got {num_tokens})")
        self.k, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram
        self.lookahead = num_tokens

    def params(self) -> dict:
        return {"num_tokens": self.k, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}

    def step(self, ctx: Context) -> StepStats:
        dev = ctx.target.device
        t0 = clock(dev)
        draft = find_continuation(ctx.target.tokens, self.max_ngram, self.min_ngram, min(self.k, ctx.budget()))
        t1 = clock(dev)
        new, _, verdict = self.verify_and_accept(ctx, Tree.chain(draft))
        return StepStats(len(new), [len(draft)], [len(verdict.path)], [t1 - t0], clock(dev) - t1)


class LookupDrafter:
    """Prompt lookup as the bottom level of a hierarchy: a chain from the sequence itself."""

    def __init__(self, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.k, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram
        self.tokens: list[int] = []

    def start(self, tokens: list[int], features=None) -> None:
        self.tokens = list(tokens)

    def observe(self, tokens: list[int], features=None) -> None:
        self.tokens = list(tokens)

    def draft(self, budget: int) -> Tree:
        return Tree.chain(find_continuation(self.tokens, self.max_ngram, self.min_ngram, min(self.k, budget)))


class BatchLookup:
    """Prompt lookup for the batched scheduler: each sequence's candidate chain, from its own tokens.

    num_tokens caps the candidate; how much of it is drafted is the scheduler's call each step
    (decoding/draft_budget.py), so the cap can be generous."""

    name = "lookup"

    def __init__(self, num_tokens: int = 8, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise BadInput(f"lookup n-gram sizes need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram})")
        if not 1 <= num_tokens <= 128:
            raise BadInput(f"lookup num_tokens must be in 1..128 (got {num_tokens})")
        self.k, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram

    def params(self) -> dict:
        return {"num_tokens": self.k, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}

    def propose(self, tokens: list[int], budget: int) -> list[int]:
        return find_continuation(tokens, self.max_ngram, self.min_ngram, min(self.k, budget))

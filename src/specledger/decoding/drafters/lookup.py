"""Prompt lookup: propose the continuation of the latest earlier occurrence of the last n-gram."""

from __future__ import annotations

from specledger.decoding.drafters.base import Drafter, DraftSeq
from specledger.decoding.strategy import Strategy
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


class LookupDrafter(Drafter):
    """Prompt lookup as a drafter: each sequence's chain is the continuation of its own last n-gram's latest
    earlier occurrence. Keeps no state, and a search in the sequence costs nothing next to a forward pass;
    max_nodes caps a chain (a planner may draft less of it)."""

    name = "lookup"

    def __init__(self, max_nodes: int = 8, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise BadInput(f"lookup n-gram sizes need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram})")
        if not 1 <= max_nodes <= 128:
            raise BadInput(f"lookup max_nodes (num_tokens) must be in 1..128 (got {max_nodes})")
        self.max_nodes, self.max_ngram, self.min_ngram = max_nodes, max_ngram, min_ngram

    def params(self) -> dict:
        return {"max_nodes": self.max_nodes, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}

    def _chain(self, seq: DraftSeq, budget: int) -> list[int]:
        return find_continuation(seq.tokens, self.max_ngram, self.min_ngram, min(self.max_nodes, budget))

    def propose(self, seqs: list[DraftSeq], budgets: list[int]) -> list[Tree]:
        return [Tree.chain(self._chain(s, b)) if b > 0 else Tree() for s, b in zip(seqs, budgets)]

    def candidates(self, seqs: list[DraftSeq], caps: list[int]) -> list[int]:
        return [len(self._chain(s, c)) if c > 0 else 0 for s, c in zip(seqs, caps)]


class PromptLookup(Strategy):
    name = "lookup"
    level_names = ["lookup"]

    def __init__(
        self, target: LoadedModel, max_nodes: int | None = None, max_ngram: int = 3, min_ngram: int = 1,
        draft_length: str = "adaptive",
    ) -> None:
        """max_nodes: the most a chain holds (default 8), a cap: the planner drafts what pays of it, per step."""
        super().__init__(target, draft_length)
        self.drafter = LookupDrafter(8 if max_nodes is None else max_nodes, max_ngram, min_ngram)

    def params(self) -> dict:
        return self.drafter.params()

    def batch_drafter(self, n_slots: int) -> LookupDrafter:
        return self.drafter  # (it keeps no state: one serves every scheduler)

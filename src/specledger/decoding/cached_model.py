"""A model following a token sequence with its own KV cache.

Invariant: the cache holds the first `cache.length` tokens of `tokens`; the rest (at
least the last, "pending" token) is fed with the next forward pass. Adopting a new
sequence keeps the common cached prefix, which is how every level resynchronises after
a verification (O(1) rollback, no recomputation of what is still valid).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput


@dataclass
class Forward:
    logits: torch.Tensor  # (1 + len(tree), V): at the root (last sequence token) and at every node
    hidden: torch.Tensor  # (n_run + len(tree), H): final-normed features of every token fed
    n_run: int  # sequence tokens fed before the tree


class CachedModel:
    def __init__(self, lm: LoadedModel, max_len: int) -> None:
        self.lm = lm
        self.model = lm.model
        self.max_len = max_len
        self.cache = lm.model.new_cache(max_len)
        self.tokens: list[int] = []

    @property
    def device(self) -> torch.device:
        return self.model.device

    def room(self) -> int:
        """Tokens that can still be drafted on top of the sequence."""
        return self.max_len - len(self.tokens)

    def sync(self, tokens: list[int]) -> None:
        n = min(self.cache.length, len(tokens) - 1)
        common = 0
        mine = self.tokens
        while common < n and mine[common] == tokens[common]:
            common += 1
        self.cache.rollback(common)
        self.tokens = list(tokens)

    def prefill(self, tokens: list[int]) -> torch.Tensor:
        """Feed the whole sequence; return logits at its last position (hidden kept for drafters)."""
        if len(tokens) > self.max_len:
            raise BadInput(f"prompt of {len(tokens)} tokens exceeds the context of {self.max_len} tokens")
        self.tokens = list(tokens)
        self.cache.rollback(0)
        x = torch.tensor([tokens], device=self.device)
        h = self.model.hidden(x, self.cache)
        self.last_hidden = h[0]
        return self.model.logits(h[:, -1])[0]

    def catch_up(self) -> torch.Tensor:
        """Cache every token but the pending one; return the features of the tokens fed."""
        run = self.tokens[self.cache.length : -1]
        if not run:
            return self.model.rope_cos.new_zeros(0, self.lm.config.hidden_size)
        return self.model.hidden(torch.tensor([run], device=self.device), self.cache)[0]

    def forward(self, tree: Tree | None = None, *, all_logits: bool = False) -> Forward:
        """Feed the uncached run of the sequence plus a tree hanging off its last token.

        The tree's entries are appended to the cache; `accept` keeps only the accepted path.
        """
        start = self.cache.length
        run = self.tokens[start:]
        n_run, n_tree = len(run), len(tree) if tree else 0
        if start + n_run + n_tree > self.max_len:
            raise BadInput(f"draft of {n_tree} tokens does not fit the remaining context ({self.max_len - start - n_run})")
        x = torch.tensor([run + (tree.tokens if tree else [])], device=self.device)
        if tree is None or n_tree == 0 or tree.is_chain():
            positions = mask = None  # plain causal continuation
        else:
            depths = torch.tensor(tree.depths())
            positions = torch.cat([torch.arange(start, start + n_run), start + n_run - 1 + depths]).to(self.device)
            n = n_run + n_tree
            mask = torch.zeros(n, start + n, dtype=torch.bool)
            mask[:, :start] = True
            mask[:n_run, start : start + n_run] = torch.ones(n_run, n_run, dtype=torch.bool).tril()
            mask[n_run:, start : start + n_run] = True
            mask[n_run:, start + n_run :] = tree.ancestor_mask()
            mask = mask.to(self.device)
        h = self.model.hidden(x, self.cache, positions=positions, mask=mask)[0]
        logits = self.model.logits(h if all_logits else h[n_run - 1 :])
        return Forward(logits, h, n_run)

    def accept(self, fwd: Forward, path: list[int], new_tokens: list[int]) -> torch.Tensor:
        """Keep the run and the accepted path in the cache; append the emitted tokens.

        Returns the features of the tokens now newly cached (the run, then the path).
        """
        tree_start = self.cache.length - (fwd.hidden.shape[0] - fwd.n_run)
        self.cache.keep(tree_start, [tree_start + i for i in path])
        self.tokens.extend(new_tokens)
        rows = list(range(fwd.n_run)) + [fwd.n_run + i for i in path]
        return fwd.hidden[rows]

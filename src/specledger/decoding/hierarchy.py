"""HierSpec-style hierarchy: a tree drafter, intermediate verifiers that turn trees into chains,
and the target that verifies only the final chain.

Level 0 is the drafter (an EAGLE head or prompt lookup); it proposes trees to the lowest
intermediate model, which verifies them (one masked pass each) and appends accepted path +
bonus token to a chain until the chain holds `min_chain` tokens. Each higher intermediate
verifies the chain of the one below the same way, and the target verifies the top chain in
one causal pass. Every level is a lossless verifier of the one below, so the output is the
target's (greedy: identical; sampling: each chain token carries its model's distribution as q).
The point: the wide tree is checked by a model whose verification is cheap, while the
expensive (e.g. quantized, compute-bound) target sees a short chain.
"""

from __future__ import annotations

from typing import TypedDict

import torch

from specledger.decoding.cached_model import CachedModel
from specledger.decoding.draft_model import check_same_tokenizer
from specledger.decoding.drafter import Drafter, DraftSeq
from specledger.decoding.strategy import Context, StepStats, Strategy, clock
from specledger.decoding.tree import Tree
from specledger.decoding.verify import verify
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput


class _TreeParams(TypedDict):
    top_k: int
    depth: int
    total_nodes: int


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


class Hierarchy(Strategy):
    name = "hier"

    def __init__(
        self,
        target: LoadedModel,
        intermediate: LoadedModel | list[LoadedModel],
        drafter: str = "eagle",
        head=None,
        top_k: int = 10,
        depth: int = 3,
        total_nodes: int = 30,
        min_chain: int | list[int] = 6,
        max_chain: int = 10,
        lookup_tokens: int = 10,
    ) -> None:
        super().__init__(target)
        self.mids = _as_list(intermediate)
        for m in self.mids:
            check_same_tokenizer(target, m)
        self.min_chain = _as_list(min_chain) * (len(self.mids) if not isinstance(min_chain, list) else 1)
        if len(self.min_chain) != len(self.mids) or any(c < 1 for c in self.min_chain):
            raise BadInput(f"min_chain needs one value >= 1 per intermediate level (got {min_chain})")
        if max_chain < max(self.min_chain):
            raise BadInput(f"max_chain ({max_chain}) must be >= min_chain ({max(self.min_chain)})")
        if drafter not in ("eagle", "lookup"):
            raise BadInput(f"hier drafter must be 'eagle' or 'lookup' (got {drafter!r})")
        self.drafter_kind, self.max_chain = drafter, max_chain
        self.tree_params: _TreeParams = {"top_k": top_k, "depth": depth, "total_nodes": total_nodes}
        if drafter == "eagle":
            from specledger.decoding.eagle import resolve_head

            self.head, self.head_source = resolve_head(self.mids[0], head)
        else:
            self.lookup_tokens = lookup_tokens
        self.level_names = [drafter] + [f"mid{i}:{m.label}" for i, m in enumerate(self.mids)]
        self.lookahead = max_chain

    def params(self) -> dict:
        p = {"drafter": self.drafter_kind, "intermediates": [m.label for m in self.mids], "min_chain": self.min_chain,
             "max_chain": self.max_chain}
        if self.drafter_kind == "eagle":
            p |= self.tree_params | {"head": self.head_source}
        else:
            p["lookup_tokens"] = self.lookup_tokens
        return p

    def start(self, ctx: Context) -> None:
        self.runners = [CachedModel(m, ctx.target.max_len) for m in self.mids]
        for r in self.runners:
            r.prefill(ctx.prompt)
            r.sync(ctx.target.tokens)
        if self.drafter_kind == "eagle":
            from specledger.decoding.eagle import EagleDrafter

            self.drafter: Drafter = EagleDrafter(self.head, self.mids[0], max_len=ctx.target.max_len,
                                                 **self.tree_params)
        else:
            from specledger.decoding.lookup import LookupDrafter

            self.drafter = LookupDrafter(self.lookup_tokens)
        self.seq = DraftSeq(0, self.runners[0].tokens, ctx.sp, ctx.gen)  # the drafter follows the lowest level
        self.drafter.begin(self.seq, self.runners[0].last_hidden if self.drafter.wants_features else None)

    def _resync(self, level: int, tokens: list[int]) -> None:
        """Adopt the sequence of the level above; the lowest intermediate also re-feeds the drafter."""
        r = self.runners[level]
        r.sync(tokens)
        if level == 0:
            self.seq.tokens = r.tokens
            self.drafter.accept(self.seq, r.catch_up() if self.drafter.wants_features else None)

    def _chain(self, level: int, ctx: Context, budget: int, st: StepStats
               ) -> tuple[list[int], list[torch.Tensor] | None]:
        """Tokens model `level` appends to its own sequence by verifying what the level below proposes."""
        runner = self.runners[level]
        chain: list[int] = []
        qs: list[torch.Tensor] | None = None if ctx.sp.greedy else []
        while len(chain) < self.min_chain[level] and budget - len(chain) > 0:
            room = budget - len(chain)
            t0 = clock(runner.device)
            if level == 0:
                self.seq.tokens = runner.tokens
                tree = self.drafter.propose([self.seq], [room])[0]
                st.level_s[0] += clock(runner.device) - t0
                t0 = clock(runner.device)
            else:
                self._resync(level - 1, runner.tokens)
                tokens, q = self._chain(level - 1, ctx, room, st)
                tree = Tree.chain(tokens, q)
                t0 = clock(runner.device)
            fwd = runner.forward(tree)
            verdict = verify(fwd.logits, tree, ctx.sp, ctx.gen)
            new = verdict.tokens(tree)
            feats = runner.accept(fwd, verdict.path, new)
            if level == 0:
                self.seq.tokens = runner.tokens
                self.drafter.accept(self.seq, feats if self.drafter.wants_features else None)
            if qs is not None:
                probs = verdict.probs
                if probs is None:  # verify() returns the target's rows whenever it samples
                    raise RuntimeError("sampling verification returned no target distribution")
                qs.extend(probs[r] for r in verdict.rows())
            chain.extend(new)
            st.verifications[level].append((len(tree), len(verdict.path)))
            st.level_s[level + 1] += clock(runner.device) - t0
        return chain, qs

    def step(self, ctx: Context) -> StepStats:
        n = len(self.mids)
        st = StepStats(appended=0, verifications=[[] for _ in range(n + 1)], level_s=[0.0] * (n + 1))
        self._resync(n - 1, ctx.target.tokens)
        budget = min(ctx.budget(), self.max_chain)
        tokens, qs = self._chain(n - 1, ctx, budget, st) if budget > 0 else ([], None)
        tokens = tokens[:budget]
        qs = qs[:budget] if qs is not None else None
        t0 = clock(ctx.target.device)
        new, _, verdict = self.verify_and_accept(ctx, Tree.chain(tokens, qs))
        st.verify_s = clock(ctx.target.device) - t0
        st.appended = len(new)
        st.verifications[n].append((len(tokens), len(verdict.path)))
        return st

"""The drafter: what proposes tokens for a verifier to check, for one sequence or a batch of them.

One lifecycle, the same alone and in a continuous batch (after llama.cpp's common/speculative and
Hugging Face's candidate generators): `begin` a sequence (its prompt is cached by the verifier, the first
token pending), `propose` a tree for each of several sequences within a budget of nodes, `accept` once the
verifier has kept part of it (the sequence's tokens have grown), `end` when it leaves. A chain is a tree.

Drafters: prompt lookup (lookup.py), a draft model (draft_model.py: an intermediate model over the base, which
proposes nothing), an EAGLE head (eagle.py; the verifier's features), and a hierarchy (hierarchy.py: a drafter
under a stack of verifiers).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from specledger.decoding.sampling import SamplingParams
from specledger.decoding.tree import Tree
from specledger.engine.slot_cache import SlotCache


@dataclass
class DraftSeq:
    """A sequence as a drafter sees it.

    tokens: the verifier's sequence, pending last token included (its list; drafters read it, never change
    it); sp and gen: the request's sampling, which a stochastic drafter samples its proposals with; kv: the
    verifier's cache and the sequence's slot in it, for `begin` (a draft model of the verifier's own weights
    takes the prompt's entries from it: model.ModelDrafter)."""

    key: Hashable
    tokens: list[int]
    sp: SamplingParams
    gen: torch.Generator | None = None
    kv: tuple[SlotCache, int] | None = None


class Drafter:
    """Proposes draft trees for sequences followed from `begin` to `end` (module docstring). As it is, it follows
    nothing, costs nothing and proposes nothing: under an intermediate (model.ModelDrafter) that makes a draft
    model (each round the model verifies an empty proposal, which is its own next token); drafters override.

    features: the verifier's final-normed hidden states of the tokens it newly cached (for `begin`: the prompt;
    for `accept`: the run it fed and the accepted path), ending before the pending token; only drafters with
    `wants_features` use them (the caller may pass None otherwise). Trees list their nodes best first, parents
    before children, so any prefix of the nodes is a tree too (a planner may cut one short).
    """

    name = "none"
    wants_features = False
    tree = False  # proposes trees with several children (else chains)
    prior: float | None = None  # its measured per-token acceptance before any draft is verified (None: not measured)
    max_nodes = 0  # the most nodes one proposal may hold

    def params(self) -> dict:
        return {}

    def begin(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        pass

    def propose(self, seqs: list[DraftSeq], budgets: list[int]) -> list[Tree]:
        return [Tree() for _ in seqs]

    def accept(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        pass

    def end(self, seq: DraftSeq) -> None:
        pass

    def candidates(self, seqs: list[DraftSeq], caps: list[int]) -> list[int]:
        """How many nodes each sequence could be proposed now, at most `caps` (a planner's upper bound)."""
        return [0 for _ in seqs]

    def draft_cost(self, budgets: list[int]) -> float:
        """Estimated seconds to propose `budgets` nodes to the batch's sequences (0 for none)."""
        return 0.0


Stateless = Drafter  # the base as it is (a draft model's level below; train/data.py's recorder)

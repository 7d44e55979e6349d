"""HierSpec-style hierarchy: a tree drafter, intermediate verifiers that turn trees into chains,
and the target that verifies only the final chain.

A stack of drafters: the EAGLE head or prompt lookup at the bottom, then one `ModelDrafter` per intermediate
model, each a lossless verifier of the level below, so the output is the target's. The point: the wide tree is
checked by a model whose verification is cheap, while the expensive (e.g. quantized, compute-bound) target sees
a short chain.
"""

from __future__ import annotations

import torch

from specledger.decoding.drafters.base import Drafter
from specledger.decoding.drafters.model import ModelDrafter, same_weights
from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel
from specledger.engine.pool import POOL, key_of
from specledger.quality.agreement import next_token_logits, top1_agreement
from specledger.errors import BadInput


def check_same_tokenizer(a: LoadedModel, b: LoadedModel) -> None:
    """Levels exchange token ids, so their vocabularies must be the same, id for id."""
    if a.config.vocab_size != b.config.vocab_size:
        raise BadInput(
            f"incompatible tokenizers: {a.label} has {a.config.vocab_size} tokens, {b.label} has {b.config.vocab_size}"
        )
    if a.tokenizer is not None and b.tokenizer is not None and a.tokenizer.hf.get_vocab() != b.tokenizer.hf.get_vocab():
        raise BadInput(f"incompatible tokenizers: {a.label} and {b.label} map tokens to different ids")


AGREEMENT_TOKENS = 256  # of the built-in quality text: the draft model's prior is measured on this many


@torch.inference_mode()
def agreement_prior(target: LoadedModel, draft: LoadedModel, n: int = AGREEMENT_TOKENS) -> float | None:
    """How often the draft's next-token argmax is the target's, teacher-forced on the built-in text: the per-token
    acceptance of its greedy chains, measured once per pair of models (~0.3 s here). None without a tokenizer."""
    tokenizer = target.tokenizer
    if tokenizer is None:
        return None

    def measure() -> float:
        from specledger.data import quality_text

        ids = tokenizer.encode(quality_text())[: min(n, target.config.max_seq_len, draft.config.max_seq_len)]
        return top1_agreement(*(next_token_logits(lm, ids).argmax(-1) for lm in (target, draft)))

    return POOL.derived(key_of(draft), ("agreement_prior", key_of(target), n), measure, owner=draft.model)


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
        inner_max_nodes: int | None = None,
        min_chain: int | list[int] = 6,
        max_nodes: int = 10,
        draft_length: str = "adaptive",
        share_prompt_kv: bool = True,
    ) -> None:
        super().__init__(target, draft_length)
        self.share_prompt_kv = share_prompt_kv
        self.mids = list(intermediate) if isinstance(intermediate, (list, tuple)) else [intermediate]
        for m in self.mids:
            check_same_tokenizer(target, m)
        self.min_chain = list(min_chain) if isinstance(min_chain, (list, tuple)) else [min_chain] * len(self.mids)
        if len(self.min_chain) != len(self.mids) or any(c < 1 for c in self.min_chain):
            raise BadInput(f"min_chain needs one value >= 1 per intermediate level (got {min_chain})")
        if max_nodes < max(self.min_chain):
            raise BadInput(f"max_nodes (max_chain) ({max_nodes}) must be >= min_chain ({max(self.min_chain)})")
        if drafter not in ("eagle", "lookup"):
            raise BadInput(f"hier drafter must be 'eagle' or 'lookup' (got {drafter!r})")
        self.drafter_kind, self.max_nodes = drafter, max_nodes
        inner = inner_max_nodes if inner_max_nodes is not None else 30 if drafter == "eagle" else 10
        self.tree_params = {"top_k": top_k, "depth": depth, "max_nodes": inner}
        if drafter == "eagle":
            from specledger.decoding.drafters.eagle import check_tree_params, resolve_head

            check_tree_params(top_k, depth, inner)
            self.head, self.head_source = resolve_head(self.mids[0], head)
        else:
            from specledger.decoding.drafters.lookup import LookupDrafter

            self.lookup = LookupDrafter(inner)  # (it keeps no state: one serves every scheduler)
        self.level_names = [drafter] + [f"mid{i}:{m.label}" for i, m in enumerate(self.mids)]

    def params(self) -> dict:
        p = {"drafter": self.drafter_kind, "intermediates": [m.label for m in self.mids], "min_chain": self.min_chain,
             "max_nodes": self.max_nodes, "share_prompt_kv": self.share_prompt_kv}
        if self.drafter_kind == "eagle":
            p |= {"top_k": self.tree_params["top_k"], "depth": self.tree_params["depth"],
                  "inner_max_nodes": self.tree_params["max_nodes"], "head": self.head_source}
        else:
            p["inner_max_nodes"] = self.lookup.max_nodes
        return p

    def batch_drafter(self, n_slots: int) -> ModelDrafter:
        """The drafter at the bottom, then one ModelDrafter per intermediate, lowest first."""
        max_len = self.target.config.max_seq_len
        inner: Drafter
        if self.drafter_kind == "eagle":
            from specledger.decoding.drafters.eagle import EagleDrafter

            inner = EagleDrafter(self.head, self.mids[0], max_len=max_len, n_slots=n_slots, **self.tree_params)
        else:
            inner = self.lookup
        top = len(self.mids) - 1
        for i, m in enumerate(self.mids):
            # the top's per-token acceptance: its greedy chains are its own continuations, so its agreement with
            # the target (measured once per pair of models)
            prior = agreement_prior(self.target, m) if i == top else None
            verifier = self.target if i == top else self.mids[i + 1]
            inner = ModelDrafter(m, inner, self.level_names[i + 1], min_chain=self.min_chain[i],
                                max_nodes=self.max_nodes, n_slots=n_slots, max_len=max_len, prior=prior,
                                params=self.params() if i == top else None,
                                share_prompt_kv=self.share_prompt_kv and same_weights(m, verifier))
        assert isinstance(inner, ModelDrafter)
        return inner

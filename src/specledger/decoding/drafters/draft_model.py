"""Draft-model speculation: a chain of k tokens from a smaller (or quantized) model.

The draft model is an intermediate (model.py's ModelDrafter) over a drafter that proposes nothing: each round it
draws its own next token, in one ragged pass over every sequence still drafting, from its own slot cache."""

from __future__ import annotations

from specledger.decoding.drafters.base import Drafter
from specledger.decoding.drafters.hierarchy import agreement_prior, check_same_tokenizer
from specledger.decoding.drafters.model import ModelDrafter, same_weights
from specledger.decoding.strategy import Strategy
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput


class DraftModel(Strategy):
    name = "draft"
    level_names = ["draft"]

    def __init__(self, target: LoadedModel, draft: LoadedModel, max_nodes: int = 4,
                 draft_length: str = "adaptive", share_prompt_kv: bool = True) -> None:
        super().__init__(target, draft_length)
        self.share_prompt_kv = share_prompt_kv
        check_same_tokenizer(target, draft)
        if not 1 <= max_nodes <= 64:
            raise BadInput(f"draft max_nodes (num_tokens) must be in 1..64 (got {max_nodes})")
        self.draft_lm, self.k = draft, max_nodes

    def params(self) -> dict:
        return {"max_nodes": self.k, "draft": self.draft_lm.label, "share_prompt_kv": self.share_prompt_kv}

    def batch_drafter(self, n_slots: int) -> ModelDrafter:
        """Chains of k tokens (min_chain = max_nodes = k); its prior: its agreement with the target."""
        return ModelDrafter(self.draft_lm, Drafter(), self.name, min_chain=self.k, max_nodes=self.k, n_slots=n_slots,
                           max_len=self.target.config.max_seq_len, prior=agreement_prior(self.target, self.draft_lm),
                           params=self.params(),
                           share_prompt_kv=self.share_prompt_kv and same_weights(self.draft_lm, self.target))

"""Draft-model speculation: a chain of k tokens from a smaller (or quantized) model."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from specledger.decoding.batch_runner import BatchItem, BatchRunner, Sequence
from specledger.decoding.draft_budget import CostSurface, catch_up_share, cost_surface
from specledger.decoding.drafter import DraftSeq
from specledger.decoding.params import check_draft_length
from specledger.decoding.sampling import probs_from_logits, sample
from specledger.decoding.strategy import Strategy
from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel
from specledger.engine.pool import POOL, key_of
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
        x = torch.tensor([ids], device=target.model.device)
        top = [lm.model(x.to(lm.model.device), lm.model.new_cache(len(ids)))[0].argmax(-1).cpu() for lm in (target, draft)]
        return float((top[0] == top[1]).float().mean())

    return POOL.derived(key_of(draft), ("agreement_prior", key_of(target), n), measure, owner=draft.model)


class ModelDrafter:
    """A smaller (or quantized) model drafting chains for many sequences at once: its own slot cache, one
    ragged pass per drafted position over every sequence still drafting (the first pass also feeds what the
    verifier accepted since). Sampling draws each token from the request's own distribution and generator,
    and keeps it as q for the verifier.

    Lazy: its slots keep a prefix cache like the scheduler's, and a sequence's prompt is not prefilled when it
    begins but fed by its first proposal, with whatever else it fell behind by while it was not drafting, and
    draft_cost prices that catch-up (beyond one chain's worth of tokens, spread over the drafting steps the sequence has left). At a
    batch where drafting does not pay, the draft model then costs nothing at all, where an eager prefill of
    every joining prompt stalled the batch for a draft that was never made."""

    name = "draft"
    wants_features = False
    tree = False

    def __init__(self, draft: LoadedModel, num_tokens: int, *, n_slots: int = 1, max_len: int | None = None,
                 prior: float | None = None) -> None:
        """num_tokens: checked by the strategy (DraftModel), which builds it."""
        self.lm, self.max_nodes, self.prior = draft, num_tokens, prior
        self.runner = BatchRunner(draft, n_slots, max_len, prefix_cache=True)
        self.seqs: dict[Hashable, Sequence] = {}
        self._surface: CostSurface | None = None
        self._catchup: list[float] = []  # per sequence of the latest candidates(): extra rows its first pass prices

    def params(self) -> dict:
        return {"num_tokens": self.max_nodes, "draft": self.lm.label}

    def begin(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        """Take a slot (and whatever prefix of the prompt it caches); the rest is fed by the first proposal."""
        self.seqs[seq.key] = self.runner.open(seq.tokens)

    def accept(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        pass  # the next proposal syncs to the verifier's tokens (keeping the common prefix)

    def end(self, seq: DraftSeq) -> None:
        self.runner.close(self.seqs.pop(seq.key))

    @torch.inference_mode()
    def propose(self, seqs: list[DraftSeq], budgets: list[int]) -> list[Tree]:
        runner = self.runner
        budgets = [min(b, self.max_nodes) for b in budgets]
        mine = [self.seqs[s.key] for s in seqs]
        toks: list[list[int]] = [[] for _ in seqs]
        qs: list[list[torch.Tensor]] = [[] for _ in seqs]
        for s, m, b in zip(seqs, mine, budgets):
            if b > 0:
                runner.sync(m, s.tokens)
        for d in range(max(budgets, default=0)):
            live = [i for i, b in enumerate(budgets) if b > d]
            fwds = runner.forward([BatchItem(mine[i]) for i in live])
            for i, fwd in zip(live, fwds):
                assert fwd.logits is not None  # the whole run is fed
                logits, sp = fwd.logits[-1], seqs[i].sp
                if sp.greedy:
                    tok = int(logits.argmax())
                else:
                    gen = seqs[i].gen
                    if gen is None:
                        raise ValueError(f"sequence {seqs[i].key!r} samples without a generator")
                    q = probs_from_logits(logits, sp).cpu()
                    tok = sample(q, gen)
                    qs[i].append(q)
                runner.accept(mine[i], fwd, [], [tok])
                toks[i].append(tok)
        return [Tree.chain(t, None if s.sp.greedy else q) for t, q, s in zip(toks, qs, seqs)]

    def candidates(self, seqs: list[DraftSeq], caps: list[int]) -> list[int]:
        """caps: also the tokens each sequence has left, over which a long catch-up is spread."""
        chain = self.max_nodes + 1  # what a drafting step feeds again at most: its accepted tokens and the next
        self._catchup = []
        for s, c in zip(seqs, caps):
            behind = max(0, len(s.tokens) - 1 - self.runner.cached(self.seqs[s.key]))
            self._catchup.append(min(behind, chain) + catch_up_share(behind, chain, c))
        return [min(c, self.max_nodes) for c in caps]

    def draft_cost(self, budgets: list[int]) -> float:
        """Pass d carries one row per sequence drafting at least d tokens, the first pass also what each fell
        behind by (as of the latest candidates() over the same sequences): the draft model's own surface."""
        if not any(budgets):
            return 0.0
        if self._surface is None:
            n = self.runner.cache.n_slots
            self._surface = cost_surface(self.lm, max_rows=n, n_seqs=min(8, n), rows_per_seq=1)
        behind = self._catchup if len(self._catchup) == len(budgets) else [0.0] * len(budgets)
        first = sum(c for c, b in zip(behind, budgets) if b > 0)
        return self._surface(sum(1 for b in budgets if b > 0) + first) + sum(
            self._surface(sum(1 for b in budgets if b > d)) for d in range(1, max(budgets)))


class DraftModel(Strategy):
    name = "draft"
    level_names = ["draft"]

    def __init__(self, target: LoadedModel, draft: LoadedModel, num_tokens: int = 4,
                 draft_length: str = "adaptive") -> None:
        super().__init__(target)
        self.draft_length = check_draft_length(draft_length)
        check_same_tokenizer(target, draft)
        if not 1 <= num_tokens <= 64:
            raise BadInput(f"draft num_tokens must be in 1..64 (got {num_tokens})")
        self.draft_lm, self.k = draft, num_tokens

    def params(self) -> dict:
        return {"num_tokens": self.k, "draft": self.draft_lm.label}

    def batch_drafter(self, n_slots: int) -> ModelDrafter:
        return ModelDrafter(self.draft_lm, self.k, n_slots=n_slots, max_len=self.target.config.max_seq_len,
                            prior=agreement_prior(self.target, self.draft_lm))

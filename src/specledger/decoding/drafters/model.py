"""A model as a drafter: an intermediate model turning its inner drafter's proposals into chains.

Draft-model speculation is this over a drafter that proposes nothing (draft_model.py); a hierarchy stacks one per
intermediate model (hierarchy.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from specledger.decoding.drafters.base import Drafter, DraftSeq
from specledger.decoding.loop.runner import ModelRunner, RunItem, Sequence
from specledger.decoding.sizing.planner import CostSurface, catch_up_share, cost_surface
from specledger.decoding.tree import Tree
from specledger.decoding.verify import verify
from specledger.engine.loader import LoadedModel
from specledger.engine.timing import clock
from specledger.spec_stats import LevelStats


def same_weights(a: LoadedModel, b: LoadedModel) -> bool:
    """One checkpoint (at whatever precision) on one device: the cache entries of one fit the other."""
    return a.source == b.source and a.device == b.device


@dataclass
class _Follow:
    """One sequence at one level: its slot in the intermediate's cache, the sequence its inner drafter follows
    (the intermediate's own), the inner level's statistics (each verification by the intermediate; the seconds
    its drafter spent proposing) and the intermediate's own seconds."""

    mseq: Sequence
    inner: DraftSeq
    level: LevelStats
    own_s: float = 0.0


PER_ROUND = 2.0  # tokens a round adds to a chain (accepted path + bonus) before any is measured


class ModelDrafter(Drafter):
    """An intermediate model turning its inner drafter's proposals into chains, for many sequences at once.

    Each round the inner drafter proposes to every sequence still building its chain, and the intermediate
    verifies every proposal in one pass (its own slot cache) with the shared verifier, appending the accepted
    path and its bonus token to the chain, until the chain holds min_chain tokens (or the budget). Sampling:
    each chain token carries the intermediate's distribution as q, so the level above verifies losslessly.

    Lazy: a sequence's prompt is fed with its first proposal (and priced then), not
    when it begins, so at a batch where drafting does not pay the intermediate never reads it; its slots keep a
    prefix cache. An intermediate of its verifier's own weights (share_prompt_kv) copies the prompt's entries
    from the verifier instead (0.15 ms for 225 tokens of the embedded model, its W4A16 prefill ~0.15 s): lossless
    all the same, and hier 1.08x / 1.15x the tok/s at c=1 / 4 on an fp32 target (BENCHMARKS.md, session 23). An
    inner drafter that reads features (EAGLE) begins from what the intermediate has cached and follows it.

    Over a drafter that proposes nothing (drafter.Drafter as it is), it is a draft model (draft_model.py); no level
    below it is reported."""

    def __init__(self, mid: LoadedModel, inner: Drafter, name: str, *, min_chain: int, max_nodes: int,
                 n_slots: int = 1, max_len: int | None = None, prior: float | None = None,
                 params: dict | None = None, share_prompt_kv: bool = False) -> None:
        """min_chain, max_nodes (the longest chain): checked by the strategy (Hierarchy), which builds it. share_prompt_kv: the model
        is its verifier's weights at another precision (same_weights), so it takes the prompt from DraftSeq.kv."""
        self.lm, self.inner, self.name, self.share_prompt_kv = mid, inner, name, share_prompt_kv
        self.min_chain, self.max_nodes, self.prior = min_chain, max_nodes, prior
        self._params = params
        self.runner = ModelRunner(mid, n_slots, max_len, prefix_cache=True, keep_features=inner.wants_features)
        self.seqs: dict[Hashable, _Follow] = {}
        self.per_round = PER_ROUND if inner.max_nodes else 1.0  # measured: an EMA of the tokens a round adds
        self._surface: CostSurface | None = None
        self._catchup: list[float] = []  # per sequence of the latest candidates(): extra rows its first round feeds
        self._inner_k: list[int] = []  # per sequence of the latest candidates(): what the inner drafter could propose

    def params(self) -> dict:
        return self._params or {}  # (what the strategy reports: only the top level's are read)

    @property
    def level_names(self) -> list[str]:
        """Every level below this one, lowest first (the drafter's name, then the intermediates')."""
        below = self.inner.level_names if isinstance(self.inner, ModelDrafter) else []
        return [*below, self.inner.name] if self.inner.max_nodes else []

    # --- following the verifier's sequence --------------------------------------------------------------------

    @torch.inference_mode()
    def begin(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        """Take a slot (its first proposal feeds the prompt, unless it takes the verifier's entries:
        `share_prompt_kv`); the inner drafter begins from what the intermediate has cached (a reused prefix) when it
        reads features, else from the whole sequence."""
        runner = self.runner
        m = runner.open(seq.tokens)
        k = runner.cached(m)
        wants = self.inner.wants_features
        if self.share_prompt_kv and seq.kv is not None and not wants:
            cache, slot = seq.kv
            end = min(cache.lengths[slot], len(m.tokens) - 1)
            if end > k:
                runner.cache.take(cache, slot, m.slot, k, end)
        inner = DraftSeq(seq.key, m.tokens[: k + 1] if wants else m.tokens, seq.sp, seq.gen, (runner.cache, m.slot))
        self.seqs[seq.key] = st = _Follow(m, inner, LevelStats(name=self.inner.name, steps=0, drafts=0, time_s=0.0))
        self.inner.begin(st.inner, runner.features(m) if wants else None)
        st.inner.tokens = m.tokens

    def end(self, seq: DraftSeq) -> None:
        st = self.seqs.pop(seq.key)
        self.inner.end(st.inner)
        self.runner.close(st.mseq)

    def _follow(self, states: list[_Follow], seqs: list[DraftSeq]) -> None:
        """Adopt the verifier's tokens and bring the inner drafter along: one pass feeds, for every sequence whose
        inner drafter reads features, what the intermediate lacks short of the pending token."""
        runner = self.runner
        for st, s in zip(states, seqs):
            runner.sync(st.mseq, s.tokens)
            st.inner.tokens = st.mseq.tokens
        if not self.inner.wants_features:
            for st in states:
                self.inner.accept(st.inner, None)
            return
        starts = [runner.cached(st.mseq) for st in states]
        behind = [(st, len(st.mseq.tokens) - 1 - k) for st, k in zip(states, starts)]
        behind = [(st, n) for st, n in behind if n > 0]
        if behind:
            t0 = clock(runner.device)
            runner.forward([RunItem(st.mseq, max_run=n) for st, n in behind])
            dt = (clock(runner.device) - t0) / len(behind)
            for st, _ in behind:
                st.own_s += dt
        for st, k in zip(states, starts):
            self.inner.accept(st.inner, runner.features(st.mseq)[k:])

    # --- drafting ---------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, seqs: list[DraftSeq], budgets: list[int]) -> list[Tree]:
        runner = self.runner
        states = [self.seqs[s.key] for s in seqs]
        budgets = [min(b, self.max_nodes) if len(s.tokens) <= runner.max_len else 0 for s, b in zip(seqs, budgets)]
        live = [i for i, b in enumerate(budgets) if b > 0]
        self._follow([states[i] for i in live], [seqs[i] for i in live])
        chains: list[list[int]] = [[] for _ in seqs]
        qs: list[list[torch.Tensor]] = [[] for _ in seqs]
        building = live
        dev = runner.device
        while building:
            sts = [states[i] for i in building]
            rooms = [min(budgets[i] - len(chains[i]), runner.room(st.mseq)) for i, st in zip(building, sts)]
            t0 = clock(dev)
            trees = self.inner.propose([st.inner for st in sts], rooms)
            t1 = clock(dev)
            fwds = runner.forward([RunItem(st.mseq, tree) for st, tree in zip(sts, trees)])
            for i, st, tree, fwd in zip(building, sts, trees, fwds):
                s = seqs[i]
                assert fwd.logits is not None  # the whole run is fed
                verdict = verify(fwd.logits, tree, s.sp, s.gen)
                new = verdict.tokens(tree)
                feats = runner.accept(st.mseq, fwd, verdict.path, new)
                self.inner.accept(st.inner, feats if self.inner.wants_features else None)
                if not s.sp.greedy:
                    assert verdict.probs is not None  # verify() returns the intermediate's rows whenever it samples
                    qs[i].extend(verdict.probs[r] for r in verdict.rows())
                chains[i].extend(new)
                st.level.observe(len(tree), len(verdict.path))
                self.per_round += 0.05 * (len(new) - self.per_round)
            t2 = clock(dev)
            for st in sts:
                st.level.time_s = (st.level.time_s or 0.0) + (t1 - t0) / len(sts)
                st.own_s += (t2 - t1) / len(sts)
            building = [i for i in building if len(chains[i]) < min(self.min_chain, budgets[i])
                        and runner.room(states[i].mseq) >= 0]
        return [Tree.chain(c[:b], None if s.sp.greedy else q[:b]) if b > 0 else Tree()
                for c, q, s, b in zip(chains, qs, seqs, budgets)]

    # --- statistics -------------------------------------------------------------------------------------------

    def inner_levels(self, key: Hashable | None) -> list[LevelStats]:
        """The levels below this one for a sequence, lowest first (key None: the names alone, for a request that
        never drafted): what the level above verified of each one's proposals, and the seconds it spent making
        them (an intermediate's: its own passes). The scheduler reports them before the level the target verifies."""
        if key is None or not self.inner.max_nodes:  # (a draft model: no level below it)
            return [LevelStats(name=n, steps=0, drafts=0) for n in self.level_names]
        st = self.seqs[key]
        if not isinstance(self.inner, ModelDrafter):
            return [st.level.model_copy(deep=True)]
        own = st.level.model_copy(deep=True, update={"time_s": self.inner.seqs[key].own_s})
        return [*self.inner.inner_levels(key), own]

    # --- the planner's price ----------------------------------------------------------------------------------

    def candidates(self, seqs: list[DraftSeq], caps: list[int]) -> list[int]:
        """caps: also the tokens each sequence has left, over which a long catch-up is spread. The intermediate
        makes a chain whatever its inner drafter finds."""
        chain = self.max_nodes + 1  # what a round feeds again at most: the accepted chain and the next token
        sts = [self.seqs[s.key] for s in seqs]
        self._catchup = []
        for s, st, c in zip(seqs, sts, caps):
            behind = max(0, len(s.tokens) - 1 - self.runner.cached(st.mseq))
            self._catchup.append(min(behind, chain) + catch_up_share(behind, chain, c))
        caps = [min(c, self.max_nodes) for c in caps]
        self._inner_k = self.inner.candidates([st.inner for st in sts], caps)
        return caps

    def draft_cost(self, budgets: list[int]) -> float:
        """The rounds a chain of min(min_chain, budget) tokens needs at the measured tokens per round; each is the
        inner drafter's proposal and a pass of the intermediate over every sequence still building (its pending
        token and the proposal; the first pass also what each fell behind by): the intermediate's own surface."""
        if not any(budgets):
            return 0.0
        if self._surface is None:
            n, k = self.runner.cache.n_slots, self.inner.max_nodes + 1
            self._surface = cost_surface(self.lm, max_rows=n * k, n_seqs=min(8, n), rows_per_seq=k)
        n = len(budgets)
        behind = self._catchup if len(self._catchup) == n else [0.0] * n
        inner_k = self._inner_k if len(self._inner_k) == n else [self.inner.max_nodes] * n
        rounds = [math.ceil(min(b, self.min_chain) / max(1.0, self.per_round)) if b > 0 else 0 for b in budgets]
        total = 0.0
        for d in range(max(rounds)):
            ks = [min(k, b) if r > d else 0 for k, b, r in zip(inner_k, budgets, rounds)]
            rows = sum(1 + k + (behind[i] if d == 0 else 0) for i, (k, r) in enumerate(zip(ks, rounds)) if r > d)
            total += self.inner.draft_cost(ks) + self._surface(rows)
        return total

"""EAGLE-2 dynamic tree drafting with an EAGLE head, and the `EagleTree` strategy.

The drafter follows a base model's sequence (the target, or an intermediate in a
hierarchy). Its head cache holds one entry per token the base has cached: entry i pairs
the base's feature f_i with token i+1. The pending last token has no feature yet, so each
round starts from the head's prediction at the last entry (f of the pending token) and
grows the tree level by level: the top_k frontier nodes by cumulative log-probability are
fed through the head together under a tree mask, each proposes its top_k children, and
finally the best `max_nodes` candidates overall form the tree (parents first).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specledger.decoding.drafters.base import Drafter, DraftSeq
from specledger.decoding.drafters.eagle_head import EagleHead, draft_lm_head, load_head, shipped_head_dir
from specledger.decoding.loop.runner import common_prefix
from specledger.decoding.sizing.planner import catch_up_share
from specledger.decoding.strategy import Strategy
from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel, parse_dtype
from specledger.engine.pool import POOL, key_of
from specledger.engine.ragged import Segment
from specledger.engine.timing import clock
from specledger.errors import BadInput

MAX_NODES = 256
AUTO_MAX_NODES = 63  # "auto" trees: at most this many nodes (64 rows with the pending token)


def check_tree_params(top_k: int, depth: int, max_nodes: int) -> None:
    if top_k < 1 or top_k > 64:
        raise BadInput(f"EAGLE top_k must be in 1..64 (got {top_k})")
    if depth < 1 or depth > 32:
        raise BadInput(f"EAGLE depth must be in 1..32 (got {depth})")
    if max_nodes < 1 or max_nodes > MAX_NODES:
        raise BadInput(f"EAGLE max_nodes (total_nodes) must be in 1..{MAX_NODES} (got {max_nodes})")


@dataclass
class _HeadSeq:
    """One sequence the head follows: its slot in the head cache, the base's features, its latest draft."""

    slot: int
    feats: torch.Tensor  # (capacity, H): f_i of every token the base has cached (grows by doubling)
    n_feats: int = 0
    tokens: list[int] = field(default_factory=list)
    root: torch.Tensor | None = None  # predicted feature of the pending token
    todo: int = 0  # head entries [todo, n_feats) are still to be fed (the slot holds [0, todo))
    cand_tokens: list[int] = field(default_factory=list)  # the last draft's candidates, in creation order
    cand_parents: list[int] = field(default_factory=list)

    def store(self, start: int, features: torch.Tensor) -> None:
        """The base's features of tokens start.. (the newest it cached); what came after them is gone."""
        end = start + features.shape[0]
        if end > self.feats.shape[0]:
            grown = self.feats.new_zeros(max(end, 2 * self.feats.shape[0]), self.feats.shape[1])
            grown[: self.n_feats] = self.feats[: self.n_feats]
            self.feats = grown
        self.feats[start:end] = features.to(self.feats.dtype)
        self.n_feats = end

    def ranked(self, n_keep: int, score: torch.Tensor) -> Tree:
        """The best n_keep candidates by cumulative log-probability (`score`, per candidate), closed under
        parents, best first."""
        order = torch.sort(score, descending=True, stable=True).indices.tolist()  # ties: parents (older) first
        kept: set[int] = set()
        ranked: list[int] = []
        for c in order:  # a prefix of the ranking, closed under parents
            p = self.cand_parents[c]
            if p < 0 or p in kept:
                kept.add(c)
                ranked.append(c)
        chosen = ranked[:n_keep]
        index = {c: i for i, c in enumerate(chosen)}
        parents = [index[self.cand_parents[c]] if self.cand_parents[c] >= 0 else -1 for c in chosen]
        return Tree([self.cand_tokens[c] for c in chosen], parents)

@dataclass
class _DraftPrice:
    """The planner's price of a batched draft: probed seconds, fixed and per drafting sequence (each brings its
    frontier through every level and the LM head), times an EMA of measured / probed; and a lazy prompt's
    catch-up at the head's probed (then measured) time per row."""

    fixed_s: float = 0.0
    per_seq_s: float = 0.0
    scale: float = 1.0
    row_s: float | None = None  # None: not probed yet
    behind: list[float] = field(default_factory=list)  # per sequence of the latest candidates(): catch-up rows
    long_s: float = 0.0  # of the latest proposal: seconds its long catch-ups took

    def cost(self, budgets: list[int]) -> float:
        assert self.row_s is not None
        behind = self.behind if len(self.behind) == len(budgets) else [0.0] * len(budgets)
        drafting = [i for i, b in enumerate(budgets) if b > 0]
        catch_up = sum(behind[i] for i in drafting)
        return self.scale * (self.fixed_s + self.per_seq_s * len(drafting)) + self.row_s * catch_up

    def drafted(self, seconds: float, n_seqs: int) -> None:
        """A proposal for n_seqs took `seconds`: a long catch-up in it is priced per row, not as a draft."""
        probed = self.fixed_s + self.per_seq_s * n_seqs
        if probed > 0:
            self.scale += 0.2 * (min(4.0, max(0.25, (seconds - self.long_s) / probed)) - self.scale)

    def caught_up(self, seconds: float, rows: int, long: int) -> None:
        """A head catch-up of `rows`, `long` of them beyond what a drafting step feeds anyway."""
        if long > 0:
            self.long_s += seconds * long / rows
            if rows >= 32:
                r = seconds / rows
                self.row_s = r if not self.row_s else 0.8 * self.row_s + 0.2 * r

    def probed(self, row_s: float, one_s: float, many_s: float, m: int, floor: float) -> None:
        """From a head pass's time per row and full drafts for one and for m sequences; at least `floor` per
        sequence (the difference of two timings can be noise)."""
        self.row_s = row_s
        self.per_seq_s = max(floor, (many_s - one_s) / (m - 1) if m > 1 else one_s)
        self.fixed_s = max(0.0, one_s - self.per_seq_s)


@dataclass
class _Grow:
    """One sequence's tree while it grows, level by level (the tensors set from its root's top-k on)."""

    st: _HeadSeq
    n_keep: int
    committed: int
    scores: list[torch.Tensor] = field(default_factory=list)
    front: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # candidate ids of the frontier
    front_score: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    front_feat: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    anc: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # ancestor rows over the tree's head slots
    slot_of: dict[int, int] = field(default_factory=dict)
    fed: int = 0


class EagleDrafter(Drafter):
    """EAGLE-2 trees for one sequence or a batch: the head's cache has a slot per sequence, and every level of
    every sequence's tree goes through the head in one ragged pass (its frontier under its ancestor mask).

    Lazy: a joining prompt's features are not fed to the head when it begins but with its
    first proposal, and draft_cost prices that catch-up (spread over the drafting steps the sequence has
    left), so at a batch where drafting does not pay the head never reads the prompt at all."""

    name = "eagle"
    wants_features = True
    tree = True

    def __init__(
        self, head: EagleHead, base: LoadedModel, *, top_k: int = 10, depth: int = 5, max_nodes: int = 59,
        max_len: int, n_slots: int = 1,
    ) -> None:
        check_tree_params(top_k, depth, max_nodes)
        head.check_target(base)
        self.head, self.base, self.model = head, base, base.model
        self.lm_head = pooled_lm_head(head, base)
        self.vocab = head.draft_vocab.tolist() if head.draft_vocab is not None else None
        self.top_k, self.depth, self.max_nodes = top_k, depth, max_nodes
        self.max_len = max_len
        self.cache = head.new_slot_cache(n_slots, max_len + depth * top_k, device=base.model.device)
        self.seqs: dict[Hashable, _HeadSeq] = {}
        # expand every level even when no deeper node can make the kept tree (for unbiased statistics)
        self.explore = False
        self.price = _DraftPrice()  # the planner's (draft_cost)

    def params(self) -> dict:
        return {"top_k": self.top_k, "depth": self.depth, "max_nodes": self.max_nodes}

    # --- following the base's sequence ---------------------------------------------------------

    def begin(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        """A new sequence: its prompt's features are fed to the head with its first proposal."""
        h = self.head.cfg.hidden_size
        cap = max(16, len(seq.tokens) + self.depth + 1)
        self.seqs[seq.key] = _HeadSeq(self.cache.alloc(), torch.zeros(cap, h, dtype=self.head.dtype,
                                                                       device=self.model.device))
        self.accept(seq, features)

    def end(self, seq: DraftSeq) -> None:
        self.cache.release(self.seqs.pop(seq.key).slot)

    def accept(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        """The base now holds `seq.tokens` and cached `features` for its newest tokens (ending before the pending
        one). Head entries whose feature or next token changed are rolled back; the new ones are fed with the next
        proposal (in one pass for every sequence)."""
        st = self.seqs[seq.key]
        if features is None:
            raise ValueError("the EAGLE drafter needs the verifier's features")
        tokens = seq.tokens
        n_cached = len(tokens) - 1
        fstart = n_cached - features.shape[0]
        if fstart < 0 or fstart > st.n_feats:
            raise ValueError(f"features for tokens {fstart}..{n_cached} leave a gap after the {st.n_feats} known")
        common = common_prefix(st.tokens, tokens, len(tokens))
        st.store(fstart, features)
        length = self.cache.lengths[st.slot]
        valid = max(0, min(length, fstart, common - 1))  # entry i needs f_i and token i+1 unchanged
        if valid < length:
            self.cache.rollback(st.slot, valid)
            st.root = None
        st.todo = valid
        st.tokens = list(tokens)

    @torch.inference_mode()
    def _catch_up(self, states: list[_HeadSeq]) -> None:
        """Feed every sequence's pending head entries in one ragged pass; each one's last gives its root."""
        todo = [st for st in states if st.todo < st.n_feats]
        if not todo:
            return
        t0, rows = clock(self.model.device), sum(st.n_feats - st.todo for st in todo)
        dev = self.model.device
        toks = torch.tensor([t for st in todo for t in st.tokens[st.todo + 1 : st.n_feats + 1]], device=dev)
        feats = torch.cat([st.feats[st.todo : st.n_feats] for st in todo])
        pos = torch.cat([torch.arange(st.todo, st.n_feats, device=dev) for st in todo])
        segs = [Segment(st.slot, st.n_feats - st.todo) for st in todo]
        h = self.head.ragged(self.model, toks, feats, pos, segs, self.cache)
        off = 0
        for st, sg in zip(todo, segs):
            off += sg.n
            st.root, st.todo = h[off - 1], st.n_feats
        self.price.caught_up(clock(self.model.device) - t0, rows, rows - (self.depth + 1) * len(todo))

    # --- drafting ----------------------------------------------------------------------------------

    def _top(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, list[int]]:
        """Top-k log-probabilities (rows, k) over the draft vocabulary, and their token ids (flat)."""
        v, ix = torch.log_softmax(self.lm_head(h).float(), dim=-1).topk(k, dim=-1)
        ids = ix.reshape(-1).tolist()
        return v.cpu(), ids if self.vocab is None else [self.vocab[i] for i in ids]

    @torch.inference_mode()
    def propose(self, seqs: list[DraftSeq], budgets: list[int]) -> list[Tree]:
        """Each sequence's best `min(max_nodes, budget)` nodes, best first (parents before children)."""
        t0 = clock(self.model.device)
        states = [self.seqs[s.key] for s in seqs]
        for st in states:
            st.cand_tokens, st.cand_parents = [], []
        self.price.long_s = 0.0
        self._catch_up(states)
        keep = [min(self.max_nodes, b) for b in budgets]
        grow = [_Grow(st, n, self.cache.lengths[st.slot]) for st, n in zip(states, keep) if n > 0 and st.root is not None]
        if not grow:
            return [Tree() for _ in states]
        self._grow(grow)
        trees = {id(g.st): g.st.ranked(g.n_keep, torch.cat(g.scores)) for g in grow}
        self.price.drafted(clock(self.model.device) - t0, len(grow))
        return [trees.get(id(st), Tree()) for st in states]

    def _grow(self, grow: list[_Grow]) -> None:
        k = min(self.top_k, len(self.vocab) if self.vocab else self.base.config.vocab_size)
        dev = self.model.device
        roots = [g.st.root for g in grow if g.st.root is not None]
        assert len(roots) == len(grow)  # callers grow only sequences that have a root
        v, ids = self._top(torch.stack(roots), k)  # (B, k): depth 1 from every root
        for j, g in enumerate(grow):
            st = g.st
            st.cand_tokens += ids[j * k : (j + 1) * k]
            st.cand_parents += [-1] * k
            g.scores.append(v[j])
            g.front, g.front_score = torch.arange(k), v[j]
            g.front_feat = roots[j][None].expand(k, -1)
            g.anc = torch.zeros(k * self.depth, k * self.depth, dtype=torch.bool)
        for d in range(1, self.depth):
            live = []
            for g in grow:
                st = g.st
                if g.front.numel() == 0:
                    continue
                if not self.explore and len(st.cand_tokens) >= g.n_keep:  # descendants score no higher than
                    kth = float(torch.cat(g.scores).topk(g.n_keep).values[-1])  # their parent: none could
                    if float(g.front_score.max()) <= kth:  # displace the kept nodes
                        g.front = g.front[:0]
                        continue
                live.append(g)
            if not live:
                break
            toks, feats, pos, segs = [], [], [], []
            for g in live:
                st, f = g.st, g.front.numel()
                for j, c in enumerate(g.front.tolist()):
                    s = g.fed + j
                    p = st.cand_parents[c]
                    if p >= 0:
                        g.anc[s] = g.anc[g.slot_of[p]]
                    g.anc[s, s] = True
                    g.slot_of[c] = s
                mask = torch.ones(f, g.committed + g.fed + f, dtype=torch.bool)
                mask[:, g.committed :] = g.anc[g.fed : g.fed + f, : g.fed + f]
                toks += [st.cand_tokens[c] for c in g.front.tolist()]
                feats.append(g.front_feat)
                pos.append(torch.full((f,), len(st.tokens) - 2 + d, dtype=torch.long))  # depth-1 entry: pending
                segs.append(Segment(st.slot, f, mask.to(dev)))
            h = self.head.ragged(self.model, torch.tensor(toks, device=dev), torch.cat(feats), torch.cat(pos).to(dev),
                                 segs, self.cache)
            v, ids = self._top(h, k)  # (rows, k)
            row = 0
            for g, sg in zip(live, segs):
                st, f = g.st, sg.n
                g.fed += f
                gv, gh = v[row : row + f], h[row : row + f]
                cum = (g.front_score[:, None] + gv).reshape(-1)
                base_id = len(st.cand_tokens)
                st.cand_tokens += ids[row * k : (row + f) * k]
                st.cand_parents += [c for c in g.front.tolist() for _ in range(k)]
                g.scores.append(cum)
                g.front_score, best = cum.topk(min(k, cum.numel()))
                g.front = best + base_id
                g.front_feat = gh[best // k]
                row += f
        for g in grow:
            self.cache.rollback(g.st.slot, g.committed)

    def candidates(self, seqs: list[DraftSeq], caps: list[int]) -> list[int]:
        """caps: also the tokens each sequence has left, over which a long catch-up is spread."""
        sts = [self.seqs[s.key] for s in seqs]
        self.price.behind = [catch_up_share(st.n_feats - st.todo, self.depth + 1, c) for st, c in zip(sts, caps)]
        return [min(c, self.max_nodes) for c in caps]

    def draft_cost(self, budgets: list[int]) -> float:
        """The depth passes cost about the same whatever is kept, and grow with the sequences drafting; plus the
        rows of a long catch-up."""
        if not any(budgets):
            return 0.0
        if self.price.row_s is None:
            _probe(self)
        return self.price.cost(budgets)

@torch.inference_mode()
def _probe(d: EagleDrafter) -> None:
    """Time a 64-row head pass, and full drafts from its end for one sequence and for several, on spare
    slots: the price of a draft (fixed, and per sequence that drafts: each brings its frontier through every
    level and the LM head) and of a lazy prompt's catch-up per row, before any request has had either
    (without, the first plans would take drafting as free, or a batch's draft as one sequence's)."""
    d.price.row_s = 0.0
    m = min(4, d.cache.free_slots)
    if not m:
        return
    dev, n, h = d.model.device, 64, d.head.cfg.hidden_size
    slots = [d.cache.alloc() for _ in range(m)]
    explore, d.explore = d.explore, True
    try:
        rows: list[float] = []
        one: list[float] = []
        many: list[float] = []
        for _ in range(3):
            for sl in slots:
                d.cache.rollback(sl, 0)
            t0 = clock(dev)
            out = d.head.ragged(d.model, torch.zeros(n * m, dtype=torch.long, device=dev),
                                   torch.zeros(n * m, h, dtype=d.head.dtype, device=dev),
                                   torch.arange(n, device=dev).repeat(m), [Segment(sl, n) for sl in slots],
                                   d.cache)
            rows.append((clock(dev) - t0) / (n * m))
            sts = [_HeadSeq(sl, torch.zeros(0, h), n_feats=n, tokens=[0] * (n + 1), root=out[n * (i + 1) - 1],
                            todo=n) for i, sl in enumerate(slots)]
            for group, times in ((sts[:1], one), (sts, many)):
                t0 = clock(dev)
                d._grow([_Grow(st, d.max_nodes, n) for st in group])
                times.append(clock(dev) - t0)
    finally:
        d.explore = explore
        for sl in slots:
            d.cache.release(sl)
    row_s = sorted(rows)[1]  # a sequence's draft costs at least its frontier's head rows through every level
    d.price.probed(row_s, sorted(one)[1], sorted(many)[1], m, row_s * (1 + (d.depth - 1) * d.top_k))


def pooled_lm_head(head: EagleHead, base: LoadedModel) -> Callable[[torch.Tensor], torch.Tensor]:
    """draft_lm_head kept in the model pool with the target: it depends on the target's weights and the head's
    draft vocabulary and dtype only, so heads loaded again from the same directory share it."""
    ids = head.draft_vocab
    vocab = None if ids is None else hashlib.sha1(ids.cpu().numpy().tobytes()).hexdigest()
    return POOL.derived(key_of(base), ("draft_lm_head", str(head.dtype), vocab),
                        lambda: draft_lm_head(head, base.model), owner=base.model)


# --- the strategy ---------------------------------------------------------------------------------------


def resolve_head(
    target: LoadedModel, head: str | Path | EagleHead | None, dtype: torch.dtype | None = None
) -> tuple[EagleHead, str]:
    """A head object, a directory, or None for the head shipped for the target; in `dtype`
    (default: the target's compute dtype), on the target's device."""
    dtype, dev = dtype or target.model.dtype, target.model.device
    if isinstance(head, EagleHead):
        head.check_target(target)
        if head.dtype != dtype or next(head.parameters()).device != dev:
            head = copy.deepcopy(head).set_dtype(dtype).to(dev)
        return head, "object"
    if head is None:
        path = shipped_head_dir(target.name)
        if not (path / "config.json").exists():
            raise BadInput(
                f"no EAGLE head is shipped for {target.name}; train one with "
                f"`specledger train-draft --model {target.name} --out DIR` and pass it as head=DIR"
            )
        return load_head(path, target, dtype), f"shipped:{target.name}"
    return load_head(head, target, dtype), str(head)


def default_head_dtype(target: LoadedModel) -> torch.dtype:
    m = target.model
    if m.dtype == torch.float32 and m.device.type == "cpu" and getattr(torch.cpu, "_is_avx512_bf16_supported", bool)():
        return torch.bfloat16
    return m.dtype


class EagleTree(Strategy):
    name = "eagle"
    level_names = ["eagle"]

    def __init__(
        self,
        target: LoadedModel,
        head: str | Path | EagleHead | None = None,
        top_k: int = 10,
        depth: int = 3,
        max_nodes: int | str = "auto",
        head_dtype: str | None = None,
        draft_length: str = "adaptive",
    ) -> None:
        """depth 3 by default: on the CPU targets measured (benchmarks/speculation.py, docs/benchmarks-log.md)
        depths 4-6 added drafting time (~2-3 ms per level) for under 0.1 of tau with the shipped head.

        max_nodes: the most nodes a tree holds ("auto": AUTO_MAX_NODES, the draft_length policy choosing).
        head_dtype: the head's compute dtype. Default: the target's, except bf16 for an fp32 target on
        a CPU with native bf16 (drafts are only proposals: still lossless, and drafting is ~2x cheaper)."""
        super().__init__(target, draft_length)
        if max_nodes != "auto":
            try:
                max_nodes = int(max_nodes)
            except (TypeError, ValueError):
                raise BadInput(f"EAGLE max_nodes (total_nodes) must be an integer or 'auto' (got {max_nodes!r})") from None
        self.given_max_nodes = max_nodes
        self.max_nodes = AUTO_MAX_NODES if max_nodes == "auto" else int(max_nodes)
        check_tree_params(top_k, depth, self.max_nodes)
        dtype = parse_dtype(head_dtype) if head_dtype else default_head_dtype(target)
        self.head, self.head_source = resolve_head(target, head, dtype)
        self.top_k, self.depth = top_k, depth

    def params(self) -> dict:
        return {"head": self.head_source, "head_dtype": str(self.head.dtype).removeprefix("torch."), "top_k": self.top_k,
                "depth": self.depth, "max_nodes": self.given_max_nodes}

    def batch_drafter(self, n_slots: int) -> EagleDrafter:
        """The draft_length policy sizes each sequence's tree per step: the planner, or max_nodes every step."""
        return EagleDrafter(self.head, self.target, top_k=self.top_k, depth=self.depth, max_nodes=self.max_nodes,
                            max_len=self.target.config.max_seq_len, n_slots=n_slots)

"""EAGLE-2 dynamic tree drafting with an EAGLE head, and the `EagleTree` strategy.

The drafter follows a base model's sequence (the target, or an intermediate in a
hierarchy). Its head cache holds one entry per token the base has cached: entry i pairs
the base's feature f_i with token i+1. The pending last token has no feature yet, so each
round starts from the head's prediction at the last entry (f of the pending token) and
grows the tree level by level: the top_k frontier nodes by cumulative log-probability are
fed through the head together under a tree mask, each proposes its top_k children, and
finally the best `total_nodes` candidates overall form the tree (parents first).
"""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path
from typing import Callable

import torch

from specledger.decoding.eagle_head import EagleHead, draft_lm_head, load_head, shipped_head_dir
from specledger.decoding.strategy import Context, StepStats, Strategy, clock
from specledger.decoding.tree import Tree
from specledger.engine.loader import LoadedModel, parse_dtype
from specledger.engine.pool import POOL, key_of
from specledger.engine.timing import CURVE_SIZES, forward_time_curve
from specledger.errors import BadInput

MAX_NODES = 256
AUTO_MAX_NODES = 63  # the verification-cost curve is measured up to 64 tokens (the tree + the pending token)


def check_tree_params(top_k: int, depth: int, total_nodes: int) -> None:
    if top_k < 1 or top_k > 64:
        raise BadInput(f"EAGLE top_k must be in 1..64 (got {top_k})")
    if depth < 1 or depth > 32:
        raise BadInput(f"EAGLE depth must be in 1..32 (got {depth})")
    if total_nodes < 1 or total_nodes > MAX_NODES:
        raise BadInput(f"EAGLE total_nodes must be in 1..{MAX_NODES} (got {total_nodes})")


class EagleDrafter:
    def __init__(
        self, head: EagleHead, base: LoadedModel, *, top_k: int = 10, depth: int = 5, total_nodes: int = 59, max_len: int
    ) -> None:
        check_tree_params(top_k, depth, total_nodes)
        head.check_target(base)
        self.head, self.base, self.model = head, base, base.model
        self.lm_head = pooled_lm_head(head, base)
        self.vocab = head.draft_vocab.tolist() if head.draft_vocab is not None else None
        self.top_k, self.depth, self.total_nodes = top_k, depth, total_nodes
        dev = base.model.device
        self.cache = head.new_cache(max_len + depth * top_k, device=dev)
        self.feats = torch.zeros(max_len, head.cfg.hidden_size, dtype=head.dtype, device=dev)
        self.n_feats = 0
        self.tokens: list[int] = []
        self.root: torch.Tensor | None = None  # predicted feature of the pending token
        # the last draft's candidates (creation order) and their ranking, for acceptance statistics
        self.cand_tokens: list[int] = []
        self.cand_parents: list[int] = []
        self.cand_logp: list[float] = []
        self.cand_order: list[int] = []
        # expand every level even when no deeper node can make the kept tree (for unbiased statistics)
        self.explore = False
        self.full = False  # whether the last draft expanded all `depth` levels

    # --- following the base's sequence ---------------------------------------------------------

    def start(self, tokens: list[int], features: torch.Tensor) -> None:
        self.tokens, self.n_feats, self.root = [], 0, None
        self.cache.rollback(0)
        self.observe(tokens, features)

    @torch.inference_mode()
    def observe(self, tokens: list[int], features: torch.Tensor) -> None:
        n_cached = len(tokens) - 1
        fstart = n_cached - features.shape[0]
        if fstart < 0 or fstart > self.n_feats:
            raise ValueError(f"features for tokens {fstart}..{n_cached} leave a gap after the {self.n_feats} known")
        common, mine = 0, self.tokens
        lim = min(len(mine), len(tokens))
        while common < lim and mine[common] == tokens[common]:
            common += 1
        self.feats[fstart:n_cached] = features.to(self.feats.dtype)
        self.n_feats = n_cached
        valid = max(0, min(self.cache.length, fstart, common - 1))  # entry i needs f_i and token i+1 unchanged
        if valid < self.cache.length:
            self.cache.rollback(valid)
            self.root = None
        self.tokens = list(tokens)
        if valid < n_cached:
            dev = self.feats.device
            x = torch.tensor([tokens[valid + 1 : n_cached + 1]], device=dev)
            h = self.head.hidden(self.model, x, self.feats[None, valid:n_cached], self.cache)
            self.root = h[0, -1]

    # --- drafting ----------------------------------------------------------------------------------

    def _top(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, list[int]]:
        """Top-k log-probabilities (rows, k) over the draft vocabulary, and their token ids (flat)."""
        v, ix = torch.log_softmax(self.lm_head(h).float(), dim=-1).topk(k, dim=-1)
        ids = ix.reshape(-1).tolist()
        return v.cpu(), ids if self.vocab is None else [self.vocab[i] for i in ids]

    @torch.inference_mode()
    def draft(self, budget: int) -> Tree:
        n_keep = min(self.total_nodes, budget)
        self.cand_tokens, self.cand_parents, self.cand_logp, self.cand_order = [], [], [], []
        if n_keep <= 0 or self.root is None:
            return Tree()
        k, dev = min(self.top_k, len(self.vocab) if self.vocab else self.base.config.vocab_size), self.feats.device
        committed = self.cache.length
        pos0 = len(self.tokens) - 1  # entry position of a depth-1 node: the feature of the pending token
        toks, parents, logps = self.cand_tokens, self.cand_parents, self.cand_logp
        scores: list[torch.Tensor] = []

        v, ids = self._top(self.root[None], k)  # (1, k)
        toks += ids
        parents += [-1] * k
        logps += v[0].tolist()
        scores.append(v[0])
        front = torch.arange(k)  # candidate ids of the frontier
        front_score = v[0]
        front_feat = self.root[None].expand(k, -1)
        # ancestor rows over the tree slots fed into the head cache
        anc = torch.zeros(k * self.depth, k * self.depth, dtype=torch.bool)
        slot_of: dict[int, int] = {}
        fed = 0
        self.full = True
        for d in range(1, self.depth):
            if not self.explore and len(toks) >= n_keep:  # descendants score no higher than their parent:
                kth = float(torch.cat(scores).topk(n_keep).values[-1])  # none could displace the kept nodes
                if float(front_score.max()) <= kth:
                    self.full = False
                    break
            f = front.numel()
            for j, c in enumerate(front.tolist()):
                s = fed + j
                p = parents[c]
                if p >= 0:
                    anc[s] = anc[slot_of[p]]
                anc[s, s] = True
                slot_of[c] = s
            mask = torch.ones(f, committed + fed + f, dtype=torch.bool)
            mask[:, committed:] = anc[fed : fed + f, : fed + f]
            x = torch.tensor([[toks[c] for c in front.tolist()]], device=dev)
            positions = torch.full((f,), pos0 + d - 1, dtype=torch.long, device=dev)
            h = self.head.hidden(self.model, x, front_feat[None], self.cache, positions=positions, mask=mask.to(dev))[0]
            fed += f
            v, ids = self._top(h, k)  # (f, k)
            cum = (front_score[:, None] + v).reshape(-1)
            base_id = len(toks)
            toks += ids
            parents += [c for c in front.tolist() for _ in range(k)]
            logps += v.reshape(-1).tolist()
            scores.append(cum)
            front_score, best = cum.topk(min(k, cum.numel()))
            front = best + base_id
            front_feat = h[best // k]
        self.cache.rollback(committed)

        score = torch.cat(scores)
        order = torch.sort(score, descending=True, stable=True).indices.tolist()  # ties: parents (older) first
        kept: set[int] = set()
        ranked: list[int] = []
        for c in order:  # a prefix of the ranking, closed under parents
            if parents[c] < 0 or parents[c] in kept:
                kept.add(c)
                ranked.append(c)
        self.cand_order = ranked
        chosen = sorted(ranked[:n_keep])  # creation order: parents precede children
        index = {c: i for i, c in enumerate(chosen)}
        return Tree([toks[c] for c in chosen], [index[parents[c]] if parents[c] >= 0 else -1 for c in chosen])

    def expected_hits(self, new_tokens: list[int]) -> torch.Tensor:
        """For the last draft: hits[r] = 1 if the r-th ranked candidate lies on the emitted path.

        A candidate at depth d is on the path iff its tokens equal new_tokens[:d]; deeper than the
        emitted tokens it is unknown and counted with the head's own probability.
        """
        toks, parents = self.cand_tokens, self.cand_parents
        hit = [0.0] * len(toks)
        depth = [0] * len(toks)
        for c in range(len(toks)):
            p = parents[c]
            depth[c] = 1 if p < 0 else depth[p] + 1
            up = 1.0 if p < 0 else hit[p]
            if up == 0.0:
                continue
            d = depth[c]
            if d <= len(new_tokens):
                hit[c] = up if toks[c] == new_tokens[d - 1] else 0.0
            else:
                hit[c] = up * math.exp(self.cand_logp[c])
        return torch.tensor([hit[c] for c in self.cand_order])

    def confidence(self) -> torch.Tensor:
        """The head's own estimate (product of its probabilities) for the last draft's ranked candidates."""
        toks, parents = self.cand_tokens, self.cand_parents
        cum = [0.0] * len(toks)
        for c in range(len(toks)):
            p = parents[c]
            cum[c] = self.cand_logp[c] + (cum[p] if p >= 0 else 0.0)
        return torch.tensor([math.exp(cum[c]) for c in self.cand_order])


# --- the target's verification-cost curve --------------------------------------------------------

def verify_cost_curve(lm: LoadedModel, context: int = 256, reps: int = 3) -> dict[int, float]:
    """Seconds of one target forward of n tokens on top of `context` cached tokens.

    Measured once per model (file and precision) and device while the model pool keeps it: the fastest of
    `reps` rounds (other load only ever adds time), made non-decreasing in n.
    """
    def measure() -> dict[int, float]:
        curve, prev = {}, 0.0
        for n, t in forward_time_curve(lm, context=context, sizes=CURVE_SIZES, reps=reps, stat="min").items():
            prev = curve[n] = max(prev, t)
        return curve

    return POOL.derived(key_of(lm), ("eagle_verify_cost_curve", lm.name, context, reps), measure)


def pooled_lm_head(head: EagleHead, base: LoadedModel) -> Callable[[torch.Tensor], torch.Tensor]:
    """draft_lm_head kept in the model pool with the target: it depends on the target's weights and the head's
    draft vocabulary and dtype only, so heads loaded again from the same directory share it."""
    ids = head.draft_vocab
    vocab = None if ids is None else hashlib.sha1(ids.cpu().numpy().tobytes()).hexdigest()
    return POOL.derived(key_of(base), ("draft_lm_head", str(head.dtype), vocab),
                        lambda: draft_lm_head(head, base.model), owner=base.model)


def interpolate(curve: dict[int, float], n: int) -> float:
    xs = sorted(curve)
    if n <= xs[0]:
        return curve[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if n <= b:
            return curve[a] + (curve[b] - curve[a]) * (n - a) / (b - a)
    a, b = xs[-2], xs[-1]
    return curve[b] + (curve[b] - curve[a]) * (n - b) / (b - a)


class TreeSizer:
    """Chooses the tree size that maximises expected tokens per second.

    tokens/step(N) = 1 + expected accepted among the N best-ranked candidates (the head's own
    confidence as a prior, replaced by what verification actually accepted as steps accumulate);
    seconds/step(N) = fixed per-step time (drafting, bookkeeping) + the target's forward of N + 1.
    """

    def __init__(self, curve: dict[int, float], max_nodes: int = AUTO_MAX_NODES, prior_steps: float = 4.0) -> None:
        self.curve, self.max_nodes, self.prior_steps = curve, max_nodes, prior_steps
        self.hits = torch.zeros(0, dtype=torch.float64)
        self.steps = 0
        self.fixed_s: float | None = None
        self.choice = min(max_nodes, 32)
        self.history: list[int] = []
        self.calls, self.explore_every = 0, 8

    def choose(self, confidence: torch.Tensor | None, budget: int) -> int:
        n_max = max(1, min(self.max_nodes, budget))
        m = min(n_max, max(self.hits.numel(), confidence.numel() if confidence is not None else 0))
        if m == 0 or self.fixed_s is None:
            return max(1, min(self.choice, n_max))
        acc = torch.zeros(m, dtype=torch.float64)
        w = 0.0
        if confidence is not None and confidence.numel():
            c = torch.zeros(m, dtype=torch.float64)
            c[: min(m, confidence.numel())] = confidence[:m].double()
            acc += self.prior_steps * c
            w += self.prior_steps
        if self.steps:
            h = torch.zeros(m, dtype=torch.float64)
            h[: min(m, self.hits.numel())] = self.hits[:m]
            acc += h
            w += self.steps
        tokens = 1 + (acc / w).cumsum(0)
        secs = torch.tensor([self.fixed_s + interpolate(self.curve, n + 1) for n in range(1, m + 1)], dtype=torch.float64)
        self.choice = int((tokens / secs).argmax()) + 1
        self.history.append(self.choice)
        return self.choice

    def wants_full_draft(self) -> bool:
        """Every few steps (and at first) draft all levels, so that the statistics cover every tree size."""
        self.calls += 1
        return self.steps < 8 or self.calls % self.explore_every == 0

    def update(self, hits: torch.Tensor | None, step_s: float, used: int) -> None:
        """hits: the last full draft's per-rank hits (None for a draft cut short); step_s: the step's time."""
        if hits is not None:
            h = hits.double()
            if h.numel() > self.hits.numel():
                self.hits = torch.cat([self.hits, torch.zeros(h.numel() - self.hits.numel(), dtype=torch.float64)])
            self.hits[: h.numel()] += h
            self.steps += 1
        fixed = max(0.0, step_s - interpolate(self.curve, used + 1))
        self.fixed_s = fixed if self.fixed_s is None else 0.9 * self.fixed_s + 0.1 * fixed


# --- the strategy ---------------------------------------------------------------------------------------


def resolve_head(
    target: LoadedModel, head: str | Path | EagleHead | None, dtype: torch.dtype | None = None
) -> tuple[EagleHead, str]:
    """A head object, a directory, or None for the head shipped for the target; in `dtype`
    (default: the target's compute dtype)."""
    dtype = dtype or target.model.dtype
    if isinstance(head, EagleHead):
        head.check_target(target)
        if head.dtype != dtype:
            head = copy.deepcopy(head).set_dtype(dtype)
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
        total_nodes: int | str = "auto",
        head_dtype: str | None = None,
    ) -> None:
        """depth 3 by default: on the CPU targets measured (benchmarks/speculation.py, BENCHMARKS.md) depths 4-6
        added drafting time (~2-3 ms per level) for under 0.1 of tau with the shipped head.

        head_dtype: the head's compute dtype. Default: the target's, except bf16 for an fp32 target on
        a CPU with native bf16 (drafts are only proposals: still lossless, and drafting is ~2x cheaper)."""
        super().__init__(target)
        auto = total_nodes == "auto"
        if not auto:
            try:
                total_nodes = int(total_nodes)
            except (TypeError, ValueError):
                raise BadInput(f"EAGLE total_nodes must be an integer or 'auto' (got {total_nodes!r})") from None
        check_tree_params(top_k, depth, AUTO_MAX_NODES if auto else total_nodes)
        dtype = parse_dtype(head_dtype) if head_dtype else default_head_dtype(target)
        self.head, self.head_source = resolve_head(target, head, dtype)
        self.top_k, self.depth = top_k, depth
        self.total_nodes = total_nodes
        self.lookahead = AUTO_MAX_NODES if auto else int(total_nodes)
        self.sizer = TreeSizer(verify_cost_curve(target)) if auto else None
        self.drafter: EagleDrafter | None = None

    def params(self) -> dict:
        p = {"head": self.head_source, "head_dtype": str(self.head.dtype).removeprefix("torch."), "top_k": self.top_k,
             "depth": self.depth, "total_nodes": self.total_nodes}
        if self.sizer is not None:
            hist = self.sizer.history
            p["auto_nodes"] = self.sizer.choice
            p["auto_nodes_mean"] = round(sum(hist) / len(hist), 1) if hist else None
            p["verify_curve_ms"] = {n: round(1000 * s, 2) for n, s in self.sizer.curve.items()}
        return p

    def start(self, ctx: Context) -> None:
        n = self.lookahead
        self.drafter = EagleDrafter(self.head, self.target, top_k=self.top_k, depth=self.depth,
                                    total_nodes=n, max_len=ctx.target.max_len)
        self.drafter.start(ctx.target.tokens, ctx.target.last_hidden)

    def step(self, ctx: Context) -> StepStats:
        dev = ctx.target.device
        drafter = self.drafter
        t0 = clock(dev)
        budget = ctx.budget()
        if self.sizer is not None:
            conf = drafter.confidence() if drafter.cand_order else None
            drafter.total_nodes = self.sizer.choose(conf, budget)
        drafter.explore = self.sizer is not None and self.sizer.wants_full_draft()
        tree = drafter.draft(budget)
        t1 = clock(dev)
        new, feats, verdict = self.verify_and_accept(ctx, tree)
        t2 = clock(dev)
        drafter.observe(ctx.target.tokens, feats)
        t3 = clock(dev)
        if self.sizer is not None:
            hits = drafter.expected_hits(new) if drafter.full and drafter.cand_order else None
            self.sizer.update(hits, t3 - t0, len(tree))
        return StepStats(len(new), [len(tree)], [len(verdict.path)], [(t1 - t0) + (t3 - t2)], t2 - t1)

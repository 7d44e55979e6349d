"""One forward pass over many sequences, each adding its own number of new tokens.

The new tokens of every sequence are flattened into rows (N = sum of each sequence's n):
embeddings, norms, the QKV/output projections, the MLP and the LM head run once over all
rows, which is the bulk of the cost and where batching pays. Attention runs per segment
against that sequence's own slot of a SlotCache, under its own mask: causal over its cache
and its own new tokens by default, or any (n, cached + n) mask (a draft tree's ancestors).
Every row of a pass's decode steps, draft chains and draft trees attends in one call over the slots (each
row its own slot, length and, in a tree, mask), whatever else the pass carries; prefill chunks attend one by
one. So a sequence that drafts costs its rows, not every sequence of the batch a slower attention path.

This module lays the pass out and attends it, knowing nothing of the model's classes; the layer that runs it
(ragged_block) and the whole pass (ragged_hidden) live in engine/model.py, beside the modules they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import torch

from specledger.engine.cpu_ops import Ops, causal_mask
from specledger.engine.slot_cache import SlotCache
from specledger.errors import BadInput


def rope_at(
    cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor | slice, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions (n,) or (B, n), shaped to broadcast over (B, n, heads, head_dim)."""
    cos, sin = cos_table[positions].to(dtype), sin_table[positions].to(dtype)
    if cos.dim() == 2:
        return cos[None, :, None], sin[None, :, None]
    return cos[:, :, None], sin[:, :, None]


@dataclass
class Segment:
    """One sequence's rows in a ragged pass: `n` consecutive rows appended to cache slot `slot`.

    mask: (n, cached + n) bool over the slot's valid entries then the new rows, True = may
    attend; None = causal (a plain continuation, a chunk of prefill, a draft chain).
    """

    slot: int
    n: int
    mask: torch.Tensor | None = None


SMALL = 16  # segments of at most this many rows attend in the rows' one call; longer ones (prefill) alone


@dataclass
class Batched:
    """The pass's rows that attend in one call: every row of its decode steps, draft chains and draft trees
    (segments of up to SMALL rows), each at its place in the pass (row) and in the cache (slot, pos), seeing its
    slot's first `lengths` entries (a chain's row: up to itself), of those what `allow` lets it (a tree's row)."""

    rows: torch.Tensor
    slots: torch.Tensor
    pos: torch.Tensor
    lengths: torch.Tensor
    longest: int
    all_rows: bool  # the pass is these rows, in order
    allow: torch.Tensor | None = None  # (R, longest) where a tree is in the call: what each row may see


@dataclass
class RaggedPass:
    """How one pass's rows map onto the slots: per segment its slot, cached length, row offset and mask; the
    rows attending in one call (decode steps, chains, trees); the rest (prefill chunks) attend one by one."""

    segments: list[Segment]
    starts: list[int]
    offsets: list[int]
    masks: list[torch.Tensor | None]
    batched: Batched | None = None
    alone: list[int] = field(default_factory=list)  # segments attending one by one

    @property
    def one_token(self) -> bool:
        """One sequence adding one token under the plain causal rule (a decode step of one sequence)."""
        return len(self.segments) == 1 and self.segments[0].n == 1 and self.masks[0] is None

    @property
    def n_rows(self) -> int:
        return self.offsets[-1]


def plan_pass(segments: list[Segment], cache: SlotCache, device: torch.device) -> RaggedPass:
    """Check the segments against the cache, make room for their rows and lay the pass out."""
    slots = [s.slot for s in segments]
    if len(set(slots)) != len(slots):
        raise ValueError("a slot appears twice in one pass")
    if any(s.n < 1 for s in segments):
        raise ValueError("a segment without rows")
    starts = [cache.lengths[s.slot] for s in segments]
    cache.reserve(max(st + s.n for st, s in zip(starts, segments)))
    masks = [s.mask if s.mask is not None or s.n == 1 else causal_mask(st, s.n, device)
             for s, st in zip(segments, starts)]
    for s, st, m in zip(segments, starts, masks):
        if m is not None and tuple(m.shape) != (s.n, st + s.n):
            raise BadInput(f"mask of slot {s.slot} is {tuple(m.shape)}, expected {(s.n, st + s.n)}")
    offsets = [0]
    for s in segments:
        offsets.append(offsets[-1] + s.n)
    plan = RaggedPass(segments, starts, offsets, masks)
    short = [j for j, s in enumerate(segments) if s.n <= SMALL]
    if not short or (len(short) == 1 and segments[short[0]].n == 1 and masks[short[0]] is None):
        plan.alone = list(range(len(segments)))  # (one decode row: the one-token path)
        return plan
    plan.alone = [j for j in range(len(segments)) if j not in set(short)]
    rows = [r for j in short for r in range(offsets[j], offsets[j + 1])]
    rslots = [segments[j].slot for j in short for _ in range(segments[j].n)]
    pos = [p for j in short for p in range(starts[j], starts[j] + segments[j].n)]
    trees = [j for j in short if segments[j].mask is not None]
    # every row sees its slot up to itself (a tree's nodes come after their ancestors), a tree's row what its mask allows
    t = torch.tensor([rows, rslots, pos], device=device)
    longest = max(pos) + 1
    allow = None
    if trees:
        allow = torch.arange(longest, device=device)[None, :] <= t[2][:, None]
        at = 0
        for j in short:
            n = segments[j].n
            m = masks[j]
            if m is not None:
                allow[at : at + n, : starts[j] + n] = m
            at += n
    plan.batched = Batched(t[0], t[1], t[2], t[2] + 1, longest, not plan.alone, allow)
    return plan


def batched_attention(b: Batched, cache: SlotCache, i: int, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, ops: Ops) -> torch.Tensor:
    """Write the rows' new entries with one scatter, attend with one call; (R, H, D), a row each.

    q (H, N, D), k / v (KV, N, D): the pass's rows; the cache is read in place, no copies."""
    if not b.all_rows:
        q, k, v = (t.index_select(1, b.rows) for t in (q, k, v))
    cache.k[i][b.slots, :, b.pos] = k.transpose(0, 1).to(cache.k.dtype)
    cache.v[i][b.slots, :, b.pos] = v.transpose(0, 1).to(cache.v.dtype)
    keys, values = cache.k[i].narrow(2, 0, b.longest), cache.v[i].narrow(2, 0, b.longest)
    return ops.rows_attention(q.transpose(0, 1).to(keys.dtype), keys, values, b.slots, b.lengths, b.allow)


def finish_pass(plan: RaggedPass, cache: SlotCache) -> None:
    """Every segment's slot now holds its new rows."""
    for s, st in zip(plan.segments, plan.starts):
        cache.lengths[s.slot] = st + s.n

"""One forward pass over many sequences, each adding its own number of new tokens.

The new tokens of every sequence are flattened into rows (N = sum of each sequence's n):
embeddings, norms, the QKV/output projections, the MLP and the LM head run once over all
rows, which is the bulk of the cost and where batching pays. Attention runs per segment
against that sequence's own slot of a SlotCache, under its own mask: causal over its cache
and its own new tokens by default, or any (n, cached + n) mask (a draft tree's ancestors).
A decode step (every segment one row, no mask) attends in one batched call over the slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from specledger.engine.cpu_ops import apply_rope, attend_new_token, batched_decode_attention, decode_attention
from specledger.engine.model import Block, Transformer, causal_mask, rope_at
from specledger.engine.slot_cache import SlotCache
from specledger.errors import BadInput


@dataclass
class Segment:
    """One sequence's rows in a ragged pass: `n` consecutive rows appended to cache slot `slot`.

    mask: (n, cached + n) bool over the slot's valid entries then the new rows, True = may
    attend; None = causal (a plain continuation, a chunk of prefill, a draft chain).
    """

    slot: int
    n: int
    mask: torch.Tensor | None = None


@dataclass
class RaggedPass:
    """How one pass's rows map onto the slots: per segment its slot, cached length, row offset and mask, and for
    a pure decode pass (every segment one row, B > 1) the index tensors of its one batched attention."""

    segments: list[Segment]
    starts: list[int]
    offsets: list[int]
    masks: list[torch.Tensor | None]
    decode_only: bool
    slot_idx: torch.Tensor | None = None
    start_idx: torch.Tensor | None = None
    top: int = 0  # slots [0, top) take part in the batched attention (those outside the pass are dropped)
    longest: int = 0
    lengths: torch.Tensor | None = None  # valid entries per slot of [0, top) after the new row
    pad: torch.Tensor | None = None

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
    plan = RaggedPass(segments, starts, offsets, masks,
                      decode_only=all(s.n == 1 and m is None for s, m in zip(segments, masks)) and len(segments) > 1)
    if plan.decode_only:
        plan.slot_idx = torch.tensor(slots, device=device)
        plan.start_idx = torch.tensor(starts, device=device)
        valid = [1] * (max(slots) + 1)  # slots outside the pass: anything finite, the rows are dropped
        for s, st in zip(segments, starts):
            valid[s.slot] = st + 1
        plan.top, plan.longest = len(valid), max(valid)
        plan.lengths = torch.tensor(valid, device=device)
        plan.pad = torch.arange(plan.longest, device=device)[None, :] >= plan.lengths[:, None]
    return plan


def ragged_block(layer: Block, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: RaggedPass,
                 cache: SlotCache) -> torch.Tensor:
    """One decoder layer over the pass's rows x (1, N, hidden), attending per segment in cache layer i."""
    a = layer.attention
    n_rows = plan.n_rows
    h = layer.attention_norm(x)  # in the compute dtype
    qkv = a.wqkv(h)
    if plan.one_token:  # one sequence decoding: RoPE, the cache write and attention in one call where it can
        slot = plan.segments[0].slot
        y1 = attend_new_token(qkv, cos, sin, cache.slot_k[i][slot][None], cache.slot_v[i][slot][None], plan.starts[0],
                              a.n_heads, h.dtype)
        if y1 is not None:
            x = a.wo.add_to(y1, x)
            return layer.feed_forward(layer.ffn_norm(x), x)
    qk_out = a.split[0] + a.split[1]
    qk = apply_rope(qkv[..., :qk_out].view(1, n_rows, a.n_heads + a.n_kv, a.hd), cos, sin)[0]
    q = qk[:, : a.n_heads].transpose(0, 1)  # (H, N, D)
    k = qk[:, a.n_heads :].transpose(0, 1)  # (KV, N, D)
    v = qkv[0, :, qk_out:].view(n_rows, a.n_kv, a.hd).transpose(0, 1)
    if plan.decode_only:
        # every sequence adds one token: one scatter writes them all, then one batched attention
        # over slots [0, top) padded to the longest; views, no copies of the cache (slots in the
        # range but not in the pass are computed and dropped)
        assert plan.slot_idx is not None and plan.start_idx is not None and plan.pad is not None
        assert plan.lengths is not None
        cache.k[i][plan.slot_idx, :, plan.start_idx] = k.transpose(0, 1).to(cache.k.dtype)
        cache.v[i][plan.slot_idx, :, plan.start_idx] = v.transpose(0, 1).to(cache.v.dtype)
        keys = cache.k[i].narrow(0, 0, plan.top).narrow(2, 0, plan.longest)
        values = cache.v[i].narrow(0, 0, plan.top).narrow(2, 0, plan.longest)
        qb = q.new_zeros((plan.top, a.n_heads, a.hd), dtype=keys.dtype)
        qb[plan.slot_idx] = q.transpose(0, 1).to(keys.dtype)
        yb = batched_decode_attention(qb[:, :, None], keys, values, plan.lengths, plan.pad)[:, :, 0]  # (top, H, D)
        y = yb.index_select(0, plan.slot_idx)
    else:
        ys = []
        for s, st, o, m in zip(plan.segments, plan.starts, plan.offsets, plan.masks):
            keys, values = cache.write(i, s.slot, st, k[:, o : o + s.n], v[:, o : o + s.n])
            qs = q[:, o : o + s.n][None].to(keys.dtype)
            if m is None:  # (in the compute dtype already: one cast fewer per layer)
                ys.append(decode_attention(qs, keys[None], values[None], h.dtype)[0])
            else:
                ys.append(F.scaled_dot_product_attention(
                    qs, keys[None], values[None], attn_mask=m, enable_gqa=a.n_kv != a.n_heads)[0])
        y = (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)).transpose(0, 1)  # (N, H, D)
    x = a.wo.add_to(y.reshape(1, n_rows, -1).to(h.dtype), x)
    return layer.feed_forward(layer.ffn_norm(x), x)


def finish_pass(plan: RaggedPass, cache: SlotCache) -> None:
    """Every segment's slot now holds its new rows."""
    for s, st in zip(plan.segments, plan.starts):
        cache.lengths[s.slot] = st + s.n


def ragged_hidden(
    model: Transformer,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    segments: list[Segment],
    cache: SlotCache,
) -> torch.Tensor:
    """Run the rows (N,) at RoPE positions (N,), grouped into segments in order; return final-normed hidden (N, H).

    Each segment's new entries are appended to its slot (its length grows by n).
    """
    n_rows = tokens.shape[0]
    if sum(s.n for s in segments) != n_rows or positions.shape[0] != n_rows:
        raise ValueError("segments, tokens and positions disagree on the number of rows")
    plan = plan_pass(segments, cache, tokens.device)
    cos, sin = rope_at(model.rope_cos, model.rope_sin, positions, model.dtype)
    x = model.tok_embeddings(tokens[None]).float()  # (1, N, hidden): the residual stream stays fp32
    for i, module in enumerate(model.layers):
        x = ragged_block(cast(Block, module), i, x, cos, sin, plan, cache)  # every entry of layers is a Block
    finish_pass(plan, cache)
    return model.norm(x)[0]


def new_slot_cache(model: Transformer, n_slots: int, max_len: int | None = None) -> SlotCache:
    """A slot cache shaped for this model, in its KV dtype and on its device."""
    c = model.cfg
    return SlotCache(c.n_layers, c.n_kv_heads, c.head_dim, n_slots, max_len or c.max_seq_len,
                     dtype=model.kv_dtype, device=model.device)

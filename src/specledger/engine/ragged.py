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
    if any(s.n < 1 for s in segments) or sum(s.n for s in segments) != n_rows or positions.shape[0] != n_rows:
        raise ValueError("segments, tokens and positions disagree on the number of rows")
    slots = [s.slot for s in segments]
    if len(set(slots)) != len(slots):
        raise ValueError("a slot appears twice in one pass")
    starts = [cache.lengths[s.slot] for s in segments]
    cache.reserve(max(st + s.n for st, s in zip(starts, segments)))
    dev = tokens.device
    masks = [
        s.mask if s.mask is not None or s.n == 1 else causal_mask(st, s.n, dev) for s, st in zip(segments, starts)
    ]
    for s, st, m in zip(segments, starts, masks):
        if m is not None and tuple(m.shape) != (s.n, st + s.n):
            raise BadInput(f"mask of slot {s.slot} is {tuple(m.shape)}, expected {(s.n, st + s.n)}")
    decode_only = all(s.n == 1 and m is None for s, m in zip(segments, masks)) and len(segments) > 1
    if decode_only:
        slot_idx = torch.tensor(slots, device=dev)
        start_idx = torch.tensor(starts, device=dev)
        valid = [1] * (max(slots) + 1)  # slots outside the pass: anything finite, the rows are dropped
        for s, st in zip(segments, starts):
            valid[s.slot] = st + 1
        top, longest = len(valid), max(valid)
        lengths = torch.tensor(valid, device=dev)
        pad = torch.arange(longest, device=dev)[None, :] >= lengths[:, None]
    offsets = [0]
    for s in segments:
        offsets.append(offsets[-1] + s.n)

    compute = model.dtype
    cos, sin = rope_at(model.rope_cos, model.rope_sin, positions, compute)
    x = model.tok_embeddings(tokens[None]).float()  # (1, N, hidden): the residual stream stays fp32
    one_token = len(segments) == 1 and segments[0].n == 1 and masks[0] is None
    for i, module in enumerate(model.layers):
        layer = cast(Block, module)  # ModuleList yields nn.Module; every entry is a Block
        a = layer.attention
        qkv = a.wqkv(layer.attention_norm(x))
        if one_token:  # one sequence decoding: RoPE, the cache write and attention in one call where it can
            slot = segments[0].slot
            y1 = attend_new_token(qkv, cos, sin, cache.slot_k[i][slot][None], cache.slot_v[i][slot][None], starts[0],
                                  a.n_heads, compute)
            if y1 is not None:
                x = a.wo.add_to(y1, x)
                x = layer.feed_forward(layer.ffn_norm(x), x)
                continue
        qk_out = a.split[0] + a.split[1]
        qk = apply_rope(qkv[..., :qk_out].view(1, n_rows, a.n_heads + a.n_kv, a.hd), cos, sin)[0]
        q = qk[:, : a.n_heads].transpose(0, 1)  # (H, N, D)
        k = qk[:, a.n_heads :].transpose(0, 1)  # (KV, N, D)
        v = qkv[0, :, qk_out:].view(n_rows, a.n_kv, a.hd).transpose(0, 1)
        if decode_only:
            # every sequence adds one token: one scatter writes them all, then one batched attention
            # over slots [0, top) padded to the longest; views, no copies of the cache (slots in the
            # range but not in the pass are computed and dropped)
            cache.k[i][slot_idx, :, start_idx] = k.transpose(0, 1).to(cache.k.dtype)
            cache.v[i][slot_idx, :, start_idx] = v.transpose(0, 1).to(cache.v.dtype)
            keys = cache.k[i].narrow(0, 0, top).narrow(2, 0, longest)
            values = cache.v[i].narrow(0, 0, top).narrow(2, 0, longest)
            qb = q.new_zeros((top, a.n_heads, a.hd), dtype=keys.dtype)
            qb[slot_idx] = q.transpose(0, 1).to(keys.dtype)
            yb = batched_decode_attention(qb[:, :, None], keys, values, lengths, pad)[:, :, 0]  # (top, H, D)
            y = yb.index_select(0, slot_idx)
        else:
            ys = []
            for s, st, o, m in zip(segments, starts, offsets, masks):
                keys, values = cache.write(i, s.slot, st, k[:, o : o + s.n], v[:, o : o + s.n])
                qs = q[:, o : o + s.n][None].to(keys.dtype)
                if m is None:  # (in the compute dtype already: one cast fewer per layer)
                    ys.append(decode_attention(qs, keys[None], values[None], compute)[0])
                else:
                    ys.append(F.scaled_dot_product_attention(
                        qs, keys[None], values[None], attn_mask=m, enable_gqa=a.n_kv != a.n_heads)[0])
            y = (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)).transpose(0, 1)  # (N, H, D)
        x = a.wo.add_to(y.reshape(1, n_rows, -1).to(compute), x)
        x = layer.feed_forward(layer.ffn_norm(x), x)
    for s, st in zip(segments, starts):
        cache.lengths[s.slot] = st + s.n
    return model.norm(x)[0]


def new_slot_cache(model: Transformer, n_slots: int, max_len: int | None = None) -> SlotCache:
    """A slot cache shaped for this model, in its KV dtype and on its device."""
    c = model.cfg
    return SlotCache(c.n_layers, c.n_kv_heads, c.head_dim, n_slots, max_len or c.max_seq_len,
                     dtype=model.kv_dtype, device=model.device)

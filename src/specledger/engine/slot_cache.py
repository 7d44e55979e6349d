"""A KV cache of slots: one sequence per slot, each with its own length.

The engine's one cache. Continuous batching keeps many sequences in it: a sequence takes a free
slot when it is admitted and gives it back when it finishes; a plain forward of a batch holds one
slot per row (Transformer.new_cache). Every per-sequence operation works on one slot alone: O(1)
rollback (a length) and compaction of an accepted tree path. The time axis grows on demand (doubling, up to max_len), so a
batch of short requests does not hold max_batch full contexts of memory.
"""

from __future__ import annotations

import torch

from specledger.errors import BadInput


class SlotCache:
    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        n_slots: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        initial_len: int = 256,
    ) -> None:
        if n_slots < 1:
            raise BadInput(f"a slot cache needs at least one slot (got {n_slots})")
        self.n_slots = n_slots
        self.max_len = max_len
        self.capacity = min(max_len, max(1, initial_len))
        shape = (n_layers, n_slots, n_kv_heads, self.capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._layer_views()
        self.lengths = [0] * n_slots  # valid entries [0, lengths[s]) of slot s
        self._free = list(range(n_slots - 1, -1, -1))  # pop() hands out the lowest slot first

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def free(self) -> list[int]:
        """The free slots, lowest last (the order alloc() hands them out in)."""
        return list(self._free)

    def alloc(self, slot: int | None = None, keep: int = 0) -> int:
        """Take a free slot: the lowest, or `slot`; it holds its first `keep` entries from before it was freed
        (a prefix cache reusing them) and nothing else. Raises when every slot is in use."""
        if not self._free:
            raise BadInput(f"all {self.n_slots} cache slots are in use")
        if slot is None:
            slot = self._free[-1]
        elif slot not in self._free:
            raise ValueError(f"slot {slot} is not free")
        if not 0 <= keep <= self.capacity:
            raise ValueError(f"cannot keep {keep} entries of a slot of {self.capacity}")
        self._free.remove(slot)
        self.lengths[slot] = keep
        return slot

    def release(self, slot: int) -> None:
        if slot in self._free:
            raise ValueError(f"slot {slot} is already free")
        self.lengths[slot] = 0  # its entries stay in memory until the slot is written again
        self._free.append(slot)
        self._free.sort(reverse=True)

    def reserve(self, length: int) -> None:
        """Make room for `length` entries in every slot (grows by doubling; copies once per growth)."""
        if length > self.max_len:
            raise BadInput(f"sequence of {length} tokens exceeds the context of {self.max_len}")
        if length <= self.capacity:
            return
        cap = self.capacity
        while cap < length:
            cap *= 2
        cap = min(cap, self.max_len)
        n_layers, n_slots, n_kv, old, hd = self.k.shape
        for name in ("k", "v"):
            new = self.k.new_zeros((n_layers, n_slots, n_kv, cap, hd))
            new[:, :, :, :old] = getattr(self, name)
            setattr(self, name, new)
        self.capacity = cap
        self._layer_views()

    def _layer_views(self) -> None:
        """Views per layer and slot, made once: narrow() on these is cheaper than indexing per write."""
        self.slot_k = [[self.k[i, s] for s in range(self.k.shape[1])] for i in range(self.k.shape[0])]
        self.slot_v = [[self.v[i, s] for s in range(self.v.shape[1])] for i in range(self.v.shape[0])]

    def write(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store n new entries (kv_heads, n, head_dim) of one slot at [start, start+n); return views of [0, start+n)."""
        n = k.shape[1]
        sk, sv = self.slot_k[layer][slot], self.slot_v[layer][slot]
        sk.narrow(1, start, n).copy_(k)
        sv.narrow(1, start, n).copy_(v)
        return sk.narrow(1, 0, start + n), sv.narrow(1, 0, start + n)

    def take(self, src: SlotCache, src_slot: int, slot: int, start: int, end: int) -> None:
        """Entries [start, end) of `src`'s slot as this slot's, in this cache's dtype; the slot then holds `end`.
        For a model at another precision of the same weights (a quantized self-draft), which starts from the
        entries its verifier computed rather than its own prefill."""
        shape = [(c.k.shape[0], c.k.shape[2], c.k.shape[4]) for c in (src, self)]  # layers, KV heads, head size
        if shape[0] != shape[1]:
            raise ValueError(f"cache of shape {tuple(src.k.shape)} cannot fill one of {tuple(self.k.shape)}")
        if not 0 <= start <= min(self.lengths[slot], end) or end > src.lengths[src_slot]:
            raise ValueError(f"cannot take entries [{start}, {end}) of a slot of {src.lengths[src_slot]} "
                             f"into one of {self.lengths[slot]}")
        self.reserve(end)
        self.k[:, slot, :, start:end] = src.k[:, src_slot, :, start:end]
        self.v[:, slot, :, start:end] = src.v[:, src_slot, :, start:end]
        self.lengths[slot] = end

    def rollback(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot roll slot {slot} back to {length}: it holds {self.lengths[slot]}")
        self.lengths[slot] = length

    def keep(self, slot: int, start: int, entries: torch.Tensor | list[int]) -> None:
        """In one slot, keep the entries at `entries` (all >= start, increasing) as start, start+1, ...

        Everything before `start` is untouched; everything else after it is dropped.
        """
        idx = torch.as_tensor(entries, dtype=torch.long, device=self.k.device)
        n = idx.numel()
        if n and not (n == int(idx[-1]) - start + 1 and int(idx[0]) == start):
            ks, vs = self.k[:, slot], self.v[:, slot]  # (layers, kv, len, hd) views
            ks[:, :, start : start + n] = ks.index_select(2, idx)
            vs[:, :, start : start + n] = vs.index_select(2, idx)
        self.lengths[slot] = start + n

"""Preallocated KV cache of one sequence (or a batch of equal ones) whose length can be rolled back in O(1).

The engine's plain forward runs on it: teacher-forced passes (training data, probes, conformance) and the
EAGLE head's training. Decoding runs on the slot cache (slot_cache.py), one sequence per slot.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._layer_views()
        self.max_len = max_len
        self.length = 0  # valid slots [0, length)

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store n new entries at slots [start, start+n) and return views of slots [0, start+n)."""
        n = k.shape[2]
        lk, lv = self.layer_k[layer], self.layer_v[layer]
        lk.narrow(2, start, n).copy_(k)
        lv.narrow(2, start, n).copy_(v)
        return lk.narrow(2, 0, start + n), lv.narrow(2, 0, start + n)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (batched generation dropping finished sequences)."""
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        self._layer_views()

    def _layer_views(self) -> None:
        """One view per layer, made once: narrow() on these is cheaper than indexing per write.
        (select, not unbind: in-place writes into unbind's views are refused under autograd.)"""
        self.layer_k = [self.k.select(0, i) for i in range(self.k.shape[0])]
        self.layer_v = [self.v.select(0, i) for i in range(self.v.shape[0])]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: cache holds {self.length}")
        self.length = length

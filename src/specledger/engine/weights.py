"""A checkpoint's tensors, read from the (memory-mapped) file one at a time as the model builder asks for them.

Decoding a whole file to fp32 before building the model held ~4x the model's size at the peak (a 1.5B Q4_K_M:
14 GB). Read on demand, each tensor is decoded straight to the dtype it is kept in and dropped once placed, and
a stored code grid (Q4_K, Q8_0) is unpacked only when the precision keeps it. Both mappings read like the dicts
tests build by hand: `tensors[key]` is an fp32 tensor, `grids[key]` a grid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import torch

from specledger.engine.quant import Int4Grid, Int8Grid

Grid = Int4Grid | Int8Grid
G = TypeVar("G", Int4Grid, Int8Grid)
V = TypeVar("V")
# (dtype, rows) -> those rows (all where None) of the tensor, in dtype: a fresh tensor the caller owns
Reader = Callable[[torch.dtype, slice | None], torch.Tensor]


class _Lazy(Mapping[str, V]):
    """A mapping over `_readers` (name -> what reads the value); the subclass says how a value is read."""

    def __init__(self, readers: dict[str, tuple]) -> None:
        self._readers = readers

    def __contains__(self, key: object) -> bool:  # (Mapping's would read the value to find out)
        return key in self._readers

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)


class LazyTensors(_Lazy[torch.Tensor]):
    """Canonical tensors by name, each decoded when read (nothing is cached: read each once)."""

    _readers: dict[str, tuple[tuple[int, ...], Reader]]

    def shape(self, key: str) -> tuple[int, ...]:
        return self._readers[key][0]

    def read(self, key: str, dtype: torch.dtype = torch.float32, rows: slice | None = None) -> torch.Tensor:
        return self._readers[key][1](dtype, rows)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.read(key)

    def __delitem__(self, key: str) -> None:
        del self._readers[key]


class LazyGrids(_Lazy[Grid]):
    """The stored code grids by name, unpacked when read; `kind` says which grid a key holds without unpacking."""

    _readers: dict[str, tuple[type, Callable[[], Grid]]]

    def kind(self, key: str) -> type | None:
        entry = self._readers.get(key)
        return entry[0] if entry else None

    def __getitem__(self, key: str) -> Grid:
        return self._readers[key][1]()


def read(tensors: Mapping[str, torch.Tensor], key: str, dtype: torch.dtype, rows: slice | None = None) -> torch.Tensor:
    """One tensor (or rows of it) in `dtype`, from a LazyTensors or a plain dict (whose fp32 tensor is returned
    itself when it already is the dtype)."""
    if isinstance(tensors, LazyTensors):
        return tensors.read(key, dtype, rows)
    t = tensors[key]
    return (t if rows is None else t[rows]).to(dtype)


def shape(tensors: Mapping[str, torch.Tensor], key: str) -> tuple[int, ...]:
    return tensors.shape(key) if isinstance(tensors, LazyTensors) else tuple(tensors[key].shape)


def grid_of(grids: Mapping[str, Grid], key: str, kind: type[G]) -> G | None:
    """The stored grid of `key` where it is of `kind`, else None (a lazy grid of another kind is not unpacked)."""
    if isinstance(grids, LazyGrids) and grids.kind(key) is not kind:
        return None
    g = grids.get(key)
    return g if isinstance(g, kind) else None

"""Draft trees: a chain is the tree where every node has one child."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Tree:
    """Nodes drafted after the root (the sequence's last token).

    parents[i] is the index of node i's parent (-1 = the root); parents precede children.
    q[i], when sampling with a stochastic drafter, is the drafter's distribution at the
    parent from which node i was drawn; None means the node was chosen deterministically.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: list[torch.Tensor | None] | None = None

    @classmethod
    def chain(cls, tokens: list[int], q: Sequence[torch.Tensor | None] | None = None) -> "Tree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), list(q) if q is not None else None)

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def children(self) -> list[list[int]]:
        """children[0] are the root's; children[i + 1] are node i's, in drafting order."""
        ch: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            ch[p + 1].append(i)
        return ch

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def ancestor_mask(self) -> torch.Tensor:
        """(n, n) bool: node i may attend to node j iff j is i or one of its ancestors."""
        n = len(self.tokens)
        m = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                m[i] = m[p]
            m[i, i] = True
        return m

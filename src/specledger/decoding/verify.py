"""The one verifier every strategy shares: chains and trees, greedy and sampling.

Greedy: follow the tree from the root while some child equals the target's argmax; the
argmax after the last accepted node is the bonus token.
Sampling (Leviathan/Chen; SpecInfer for several children): accept child x with
probability min(1, p(x)/q(x)); after a rejection p <- norm(max(0, p - q)) and x leaves
q; if no child is accepted, draw from what is left of p. A deterministically chosen
child has q = one-hot(x). The emitted tokens are distributed exactly as the target's p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specledger.decoding.sampling import SamplingParams, probs_from_logits, sample
from specledger.decoding.tree import Tree


@dataclass
class Verdict:
    path: list[int]  # accepted node indices, root to leaf
    bonus: int  # the target's own token after the path
    probs: torch.Tensor | None = None  # sampling: target distribution rows (0 = root, i + 1 = node i)

    def tokens(self, tree: Tree) -> list[int]:
        return [tree.tokens[i] for i in self.path] + [self.bonus]

    def rows(self) -> list[int]:
        """For each emitted token, the row of the distribution it follows (its parent's)."""
        return [0] + [i + 1 for i in self.path]


def verify(logits: torch.Tensor, tree: Tree, sp: SamplingParams, gen: torch.Generator | None) -> Verdict:
    """logits: (1 + len(tree), V) target logits at the root and at every node."""
    children = tree.children()
    path: list[int] = []
    cur = -1
    if sp.greedy:
        best = logits.argmax(dim=-1).tolist()
        while True:
            t = best[cur + 1]
            nxt = next((c for c in children[cur + 1] if tree.tokens[c] == t), None)
            if nxt is None:
                return Verdict(path, t)
            path.append(nxt)
            cur = nxt
    assert gen is not None
    probs = probs_from_logits(logits, sp).cpu()
    while True:
        p = probs[cur + 1].clone()
        q_left: torch.Tensor | None = None
        accepted = None
        for c in children[cur + 1]:
            x = tree.tokens[c]
            q = tree.q[c] if tree.q is not None else None
            u = float(torch.rand(1, generator=gen))
            if q is None:  # deterministic choice: q = one-hot(x)
                if u < float(p[x]):
                    accepted = c
                    break
                p[x] = 0.0
            else:
                q = (q_left if q_left is not None else q.float().cpu()).clone()
                if float(q[x]) > 0 and u < min(1.0, float(p[x]) / float(q[x])):
                    accepted = c
                    break
                p = (p - q).clamp_(min=0.0)
                q[x] = 0.0
                s = float(q.sum())
                q_left = q / s if s > 0 else q
            s = float(p.sum())
            if s <= 0:  # nothing left (numerically): fall back to the target row itself
                p = probs[cur + 1].clone()
                s = float(p.sum())
            p = p / s
        if accepted is None:
            return Verdict(path, sample(p, gen), probs)
        path.append(accepted)
        cur = accepted

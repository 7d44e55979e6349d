"""What one batched pass costs when some of its sequences draft: their rows attending in the pass's one call
(engine/ragged.py) against every segment attending on its own, the layout before that call took chains and
trees (SMALL = 0 here).

B sequences on a cache of --context tokens each; per case some of them carry a draft (a chain of k tokens or
a tree of k nodes) and the rest one decode row. Every case runs both layouts and an A/A twin of the first,
alternating within each round; medians over rounds, ratios to the one-call layout.

    python benchmarks/ragged_pass.py [--dtype bf16] [--quant none] [--batch 8] [--context 300] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from common import machine, now
from specledger.decoding.loop.runner import tree_rows
from specledger.decoding.tree import Tree
from specledger.engine import ragged
from specledger.engine.loader import load_model
from specledger.engine.model import new_slot_cache, ragged_hidden


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--quant", default="none", help="none, int8 or int4")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--draft", type=int, default=3, help="tokens per chain / nodes per tree")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", dtype=args.dtype, quant=args.quant)
    m, b, ctx, k = lm.model, args.batch, args.context, args.draft
    cache = new_slot_cache(m, b, ctx + 64)
    slots = [cache.alloc() for _ in range(b)]
    gen = torch.Generator().manual_seed(0)
    tree = Tree(tokens=list(range(5, 5 + k)), parents=[-1] + [i // 2 for i in range(k - 1)])  # a bushy tree
    cases: dict[str, list[str]] = {"all decode": ["d"] * b}
    for n in sorted({1, b // 2, b}):
        cases[f"{n} chain(s) of {k}"] = ["c"] * n + ["d"] * (b - n)
        cases[f"{n} tree(s) of {k}"] = ["t"] * n + ["d"] * (b - n)

    def segments(kinds: list[str]):
        toks, pos, segs = [], [], []
        for s, kind in zip(slots, kinds):
            n = 1 + (k if kind != "d" else 0)
            toks.append(torch.randint(0, 1000, (n,), generator=gen))
            if kind == "t":
                p, mask = tree_rows(ctx, 1, tree, m.device)
                pos.append(p)
                segs.append(ragged.Segment(s, n, mask))
            else:
                pos.append(torch.arange(ctx, ctx + n))
                segs.append(ragged.Segment(s, n))
        return torch.cat(toks), torch.cat(pos), segs

    contenders = {"one call": ragged.SMALL, "each alone": 0, "one call (A/A)": ragged.SMALL}
    times: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        for s in slots:
            ragged_hidden(m, torch.randint(0, 1000, (ctx,), generator=gen), torch.arange(ctx),
                          [ragged.Segment(s, ctx)], cache)
        for rnd in range(args.rounds + 1):
            for case, kinds in cases.items():
                toks, pos, segs = segments(kinds)
                for name, small in contenders.items():
                    ragged.SMALL = small
                    t0 = time.perf_counter()
                    m.logits(ragged_hidden(m, toks, pos, segs, cache))
                    dt = time.perf_counter() - t0
                    for s in slots:
                        cache.rollback(s, ctx)
                    if rnd:  # the first round warms up
                        times.setdefault((case, name), []).append(dt)
    ragged.SMALL = contenders["one call"]
    table = Table(title=f"one pass of {b} sequences, {args.dtype} {args.quant}, {ctx}-token caches, "
                        f"{args.threads} thread(s) — {machine()}, {now()}")
    table.add_column("case")
    for name in contenders:
        table.add_column(f"{name} ms", justify="right")
    table.add_column("alone / one call", justify="right")
    table.add_column("A/A", justify="right")
    for case in cases:
        med = {name: statistics.median(times[(case, name)]) * 1e3 for name in contenders}
        one = med["one call"]
        table.add_row(case, *(f"{v:.1f}" for v in med.values()), f"{med['each alone'] / one:.2f}",
                      f"{med['one call (A/A)'] / one:.2f}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()

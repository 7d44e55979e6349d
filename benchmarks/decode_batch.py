"""Where batching stops paying: one decode pass of B sequences per batch size, per precision, on a real model.

A graded pass (issue 53) keeps `quality.concurrency` answers in flight; in process that is the batch of every
decode pass (up to an arm's `max_batch`). Past some B a pass costs B times a row: the products are compute-bound
and more rows in flight buy nothing but longer passes. This times one pass (logits included) of B sequences,
each one new token on a --context-token cache, for each batch size, the sizes in random order within each round
and --aa (a batch size measured twice per round: the A/A twin) beside them; medians over rounds, tok/s = B / pass.

    python benchmarks/decode_batch.py [--model qwen2.5-coder-1.5b] [--arms w4a16,w4a8,bf16]
        [--batch 1,8,16,32,48] [--aa 16] [--context 500] [--rounds 5] [--threads 2]

Arms: bf16, int8 (W8A16), w4a16, w4a8 (the W4A16 codes with int8 activations, weights shared).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from common import machine, now
from specledger.engine import ragged
from specledger.engine.loader import LoadedModel, activation_twin, load_model
from specledger.engine.model import new_slot_cache, ragged_hidden

ARMS = {"bf16": ("none", 16), "int8": ("int8", 16), "w4a16": ("int4", 16), "w4a8": ("int4", 8)}


def load_arms(model: str, names: list[str]) -> dict[str, LoadedModel]:
    out: dict[str, LoadedModel] = {}
    loaded: dict[str, LoadedModel] = {}  # one copy of a quantization's weights
    for name in names:
        quant, bits = ARMS[name]
        if quant not in loaded:
            loaded[quant] = load_model(model, dtype="bf16", quant=quant, with_tokenizer=False)
        lm = loaded[quant]
        out[name] = lm if bits == 16 else activation_twin(lm, bits)
    return out


def time_arm(lm: LoadedModel, sizes: list[int], aa: int | None, ctx: int, rounds: int,
             rng: random.Random) -> dict[str, list[float]]:
    m, top = lm.model, max([*sizes, aa or 1])
    cache = new_slot_cache(m, top, ctx + 8)
    slots = [cache.alloc() for _ in range(top)]
    gen = torch.Generator().manual_seed(0)
    for s in slots:
        ragged_hidden(m, torch.randint(0, 1000, (ctx,), generator=gen), torch.arange(ctx), [ragged.Segment(s, ctx)],
                      cache)
    cases = [(str(b), b) for b in sizes] + ([(f"{aa} (A/A)", aa)] if aa else [])
    times: dict[str, list[float]] = {}
    for rnd in range(rounds + 1):  # the first round warms up
        for label, b in rng.sample(cases, len(cases)):
            toks = torch.randint(0, 1000, (b,), generator=gen)
            t0 = time.perf_counter()
            m.logits(ragged_hidden(m, toks, torch.full((b,), ctx), [ragged.Segment(s, 1) for s in slots[:b]], cache))
            dt = time.perf_counter() - t0
            for s in slots[:b]:
                cache.rollback(s, ctx)
            if rnd:
                times.setdefault(label, []).append(dt)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--arms", default="w4a16,w4a8,bf16", help=f"comma list of {', '.join(ARMS)}")
    ap.add_argument("--batch", default="1,8,16,32,48", help="batch sizes")
    ap.add_argument("--aa", type=int, default=16, help="the batch size timed twice per round (0: none)")
    ap.add_argument("--context", type=int, default=500, help="cached tokens per sequence")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    names = [a for a in args.arms.split(",") if a]
    unknown = [a for a in names if a not in ARMS]
    try:
        sizes = sorted({int(b) for b in args.batch.split(",") if b})
    except ValueError:
        sys.exit(f"--batch {args.batch!r}: give batch sizes as a comma list of integers")
    if unknown or not names:
        sys.exit(f"--arms: unknown {', '.join(unknown) or '(none given)'} (choose from {', '.join(ARMS)})")
    if not sizes or min(sizes) < 1 or args.rounds < 1 or args.context < 1:
        sys.exit("--batch sizes, --rounds and --context must be at least 1")
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    arms = load_arms(args.model, names)
    table = Table(title=f"one decode pass of B sequences, {args.model}, {args.context}-token caches, "
                        f"{args.threads} thread(s), median of {args.rounds} — {machine()}, {now()}")
    labels = [str(b) for b in sizes] + ([f"{args.aa} (A/A)"] if args.aa else [])
    table.add_column("arm")
    for label in labels:
        table.add_column(f"B={label}", justify="right")
    with torch.inference_mode():
        for name, lm in arms.items():
            times = time_arm(lm, sizes, args.aa or None, args.context, args.rounds, rng)
            med = {label: statistics.median(ts) for label, ts in times.items()}
            table.add_row(name, *(f"{med[x] * 1e3:.0f} ms\n{int(x.split()[0]) / med[x]:.0f} tok/s" for x in labels))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()

"""bf16 products on oneDNN-packed weights, or on the engine's kernel where oneDNN cannot pack bf16 (an AVX2-only
host; engine/packed_linear.py), against plain F.linear, side by side.

Two copies of the bf16 model in one process, one with its Linears packed at load and one without (the default
load packs where the host can; `pack=False` is the old path), alternating within each round, with an A/A twin
(the unpacked model timed twice per round):
  - products: one layer's four products and the LM head at 1 / 8 / 16 / 64 / 256 rows;
  - passes: a decode step at a 256-token cache (one sequence's pass) and the scheduler's pass of 8 decode rows;
  - with --concurrency: closed-loop AR throughput (benchmarks/concurrency.py's run_batched) at each level;
  - the teacher-forced agreement of each with the fp32 model on ~1000 tokens, and the weights' memory.

    python benchmarks/packed_linear.py [--rounds 15] [--concurrency 1,8] [--threads 2] [--pack-rows 8]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from rich.console import Console

from common import ab_table, agreement_line, long_prompts, machine, now, rss
from concurrency import run_batched
from specledger.decoding.loop.runner import RunItem, ModelRunner
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.tree import Tree
from specledger.engine import packed_linear
from specledger.engine.loader import LoadedModel, load_model
from specledger.quality.agreement import teacher_forced_agreement

console = Console(width=150)
MODEL = "smollm2-135m"
ROWS = (1, 8, 16, 64, 256)


def cases(lm: LoadedModel) -> dict[str, Callable[[], float]]:
    """Each case: a function timing one call and undoing what it cached."""
    m = lm.model
    layer = m.layers[3]
    mods = [layer.attention.wqkv, layer.attention.wo, layer.feed_forward.w13, layer.feed_forward.w2]
    out: dict[str, Callable[[], float]] = {}

    def timed(f: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            t = time.perf_counter()
            f()
            return time.perf_counter() - t
        return run

    for r in ROWS:
        xs = [torch.randn(1, r, mod.in_features).bfloat16() for mod in mods]
        out[f"layer products, {r} rows"] = timed(lambda xs=xs: [mod(x) for mod, x in zip(mods, xs)])
    for r in (1, 8):
        h = torch.randn(1, r, m.cfg.hidden_size).bfloat16()
        out[f"LM head, {r} rows"] = timed(lambda h=h: m.output(h))
    cache = m.new_cache(512)
    m(torch.tensor([[3 + j % 900 for j in range(256)]]), cache)

    def step() -> None:
        m(torch.tensor([[17]]), cache)
        cache.lengths[0] -= 1

    out["decode step, 256 cached"] = timed(step)
    br = ModelRunner(lm, 8, 1024)
    seqs = []
    for i in range(8):
        s = br.open([1 + (j * 7 + i) % 1000 for j in range(200)])
        br.forward([RunItem(s, max_run=199)])
        seqs.append(s)
    br.cache.reserve(512)

    def batch_pass() -> None:
        br.forward([RunItem(s, Tree()) for s in seqs])
        for s in seqs:
            br.cache.lengths[s.slot] -= 1

    out["scheduler pass, 8 decode rows"] = timed(batch_pass)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--concurrency", default="", help="closed-loop AR levels to run too (e.g. 1,8)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pack-rows", type=int, default=packed_linear.PACK_ROWS,
                    help="the batch-size hint oneDNN blocks the packed weights for")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    packed_linear.PACK_ROWS = a.pack_rows
    console.print(f"{now()}  {machine()}  oneDNN pack hint {a.pack_rows} rows")
    ref = load_model(MODEL, quant="none", dtype="fp32")
    ids = ref.tokenizer.encode(" ".join(long_prompts(8)))[:1024]
    r0 = rss()
    dense = load_model(MODEL, dtype="bf16", pack=False)
    r1 = rss()
    packed = load_model(MODEL, dtype="bf16")
    r2 = rss()
    kinds = (packed_linear.PackedLinear, packed_linear.KernelLinear)
    n_packed = sum(isinstance(mod, kinds) for mod in packed.model.modules())
    if not n_packed:
        console.print("this host has neither oneDNN's bf16 packing (AVX-512 BF16/BW or AVX-NE-CONVERT) nor the "
                      "engine's kernel: nothing to compare")
        return
    how = "the engine's kernel" if any(isinstance(mod, packed_linear.KernelLinear) for mod in packed.model.modules())\
        else "oneDNN"
    contenders = {"F.linear": dense, "F.linear A/A": dense, "packed": packed}
    timers = {name: cases(lm) for name, lm in contenders.items() if name != "F.linear A/A"}
    timers["F.linear A/A"] = timers["F.linear"]
    levels = [int(x) for x in a.concurrency.split(",") if x]
    prompts = [dense.tokenizer.chat([{"role": "user", "content": p}]) for p in long_prompts(8)]
    sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
    times: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        for rnd in range(a.rounds + 1):
            for name in contenders:
                for case, f in timers[name].items():
                    dt = f()
                    if rnd:  # round 0 warms up
                        times.setdefault((case, name), []).append(dt)
                if rnd and rnd <= 3:
                    for n in levels:
                        row = run_batched(contenders[name], prompts, sp, n, max(n, a.requests))
                        times.setdefault((f"AR c={n} tok/s", name), []).append(row["tok_s"])
    console.print(ab_table(f"{packed.label}: {n_packed} Linears on {how} vs F.linear ({a.rounds} rounds, "
                           "medians)", [*timers["packed"], *(f"AR c={n} tok/s" for n in levels)], times, *contenders,
                           levels, scale=1e6, unit="us", digits=0))
    console.print(f"  weights: F.linear {dense.weight_bytes / 2**20:.1f} MiB, packed {packed.weight_bytes / 2**20:.1f} "
                  f"MiB; process RSS grew {(r1 - r0) / 2**20:.0f} MiB loading the first, {(r2 - r1) / 2**20:.0f} MiB "
                  f"the packed one")
    for name in ("F.linear", "packed"):
        console.print(agreement_line(name, teacher_forced_agreement(ref, contenders[name], ids)))


if __name__ == "__main__":
    main()

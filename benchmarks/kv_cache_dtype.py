"""A bf16 KV cache against the fp32 one for bf16-activation models (cpu_ops.Ops.kv_dtype, bf16_cache), side by
side in one process.

A bf16 model's keys and values are bf16 numbers; where the CPU computes in bf16 and the fused attention is loaded,
the cache holds them in bf16 and the kernel reads them as fp32: the same sums at half the memory traffic. Per model
(bf16, W4A16), alternating within each round with an A/A twin of the fp32 cache:
  - passes: a decode step at a 256-token cache (one sequence's pass), the scheduler's pass of 8 and of 16 decode
    rows at ~300 cached tokens each, medians over rounds, ratios to fp32;
  - with --concurrency: closed-loop AR throughput (benchmarks/concurrency.py's run_batched) at each level;
  - the teacher-forced agreement of each with the fp32 model on ~1000 tokens, and the cache's bytes.

    python benchmarks/kv_cache_dtype.py [--models bf16,int4] [--rounds 15] [--concurrency 1,8,16] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from rich.console import Console

from common import ab_table, agreement_line, long_prompts, machine, now
from concurrency import run_batched
from specledger.decoding.loop.runner import RunItem, ModelRunner
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.tree import Tree
from specledger.engine import cpu_ops
from specledger.engine.loader import LoadedModel, load_model
from specledger.quality.agreement import teacher_forced_agreement

console = Console(width=150)
PATHS = {"fp32 cache": False, "fp32 A/A": False, "bf16 cache": True}


def pass_cases(lm: LoadedModel) -> dict[str, Callable[[], float]]:
    """Each case: a function timing one pass and undoing what it cached (caches made in the current cache dtype)."""
    m = lm.model
    cache = m.new_cache(512)
    with torch.inference_mode():
        m(torch.tensor([[3 + j % 900 for j in range(256)]]), cache)

    def step() -> float:
        t = time.perf_counter()
        m(torch.tensor([[17]]), cache)
        cache.lengths[0] -= 1
        return time.perf_counter() - t

    out = {"decode step, 256 cached": step}
    for rows in (8, 16):
        r = ModelRunner(lm, rows, 1024)
        seqs = []
        for i in range(rows):
            s = r.open([1 + (j * 7 + i) % 1000 for j in range(300)])
            r.forward([RunItem(s, max_run=299)])
            seqs.append(s)
        r.cache.reserve(512)

        def batch(r: ModelRunner = r, seqs: list = seqs) -> float:
            t = time.perf_counter()
            r.forward([RunItem(s, Tree()) for s in seqs])
            dt = time.perf_counter() - t
            for s in seqs:
                r.cache.lengths[s.slot] -= 1
            return dt

        out[f"{rows} decode rows, ~300 cached"] = batch
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bf16,int4", help="comma list of bf16, int4")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--concurrency", default="", help="closed-loop AR levels to run too (e.g. 1,8,16)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    can = cpu_ops.resolve("cpu").bf16_cache
    console.print(f"{now()}  {machine()}  (a bf16 cache on this host: {can})")
    if not can:
        console.print("this host keeps the fp32 cache (no bf16 arithmetic, or no fused kernels): nothing to compare")
        return
    ref = load_model("smollm2-135m", quant="none", dtype="fp32")
    ids = ref.tokenizer.encode(" ".join(long_prompts(8)))[:1024]
    levels = [int(x) for x in a.concurrency.split(",") if x]
    for name in a.models.split(","):
        lm = load_model("smollm2-135m", quant="int4" if name == "int4" else "none", dtype="bf16")
        ops = lm.model.ops
        cases: dict[str, dict[str, Callable[[], float]]] = {}
        for path, on in PATHS.items():
            lm.model.use_ops(replace(ops, bf16_cache=on))
            cases[path] = pass_cases(lm)
        prompts = [lm.tokenizer.chat([{"role": "user", "content": p}]) for p in long_prompts(8)]
        sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
        times: dict[tuple[str, str], list[float]] = {}
        with torch.inference_mode():
            for rnd in range(a.rounds + 1):
                for path, on in PATHS.items():
                    lm.model.use_ops(replace(ops, bf16_cache=on))
                    for case, f in cases[path].items():
                        dt = f()
                        if rnd:  # round 0 warms up
                            times.setdefault((case, path), []).append(dt)
                    if rnd and rnd <= 3:
                        for n in levels:
                            row = run_batched(lm, prompts, sp, n, max(n, a.requests))
                            times.setdefault((f"AR c={n} tok/s", path), []).append(row["tok_s"])
        console.print(ab_table(f"{lm.label}: KV cache in fp32 vs bf16 ({a.rounds} rounds, medians)",
                               [*cases["bf16 cache"], *(f"AR c={n} tok/s" for n in levels)], times, *PATHS, levels))
        for path in ("fp32 cache", "bf16 cache"):
            lm.model.use_ops(replace(ops, bf16_cache=PATHS[path]))
            c = lm.model.new_cache(1024)
            mib = (c.k.numel() + c.v.numel()) * c.k.element_size() / 2**20
            console.print(agreement_line(f"{path} ({mib:.0f} MiB at 1024 positions)",
                                         teacher_forced_agreement(ref, lm, ids)))


if __name__ == "__main__":
    main()

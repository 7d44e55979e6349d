"""A prompt's chunk attending in bf16 against fp32 (engine/cpu_ops.Ops.causal_attention), side by side in one process.

On CPU the KV cache is fp32; a bf16 model's entries are bf16 values, so where the CPU computes in bf16 a chunk of
more than LONG_RUN rows attends on them in bf16. Per model (bf16, W4A16), alternating within each round with an
A/A twin of the fp32 path:
  - passes: a 256-row chunk from an empty cache, one after 256 cached tokens, and 8 decode rows beside a 256-row
    chunk (the scheduler's pass while a prompt joins): medians over rounds, ratios to fp32;
  - with --concurrency: closed-loop AR throughput (benchmarks/concurrency.py's run_batched) at each level;
  - the teacher-forced agreement of each path with the fp32 model on ~1000 tokens (what the rounding costs).

    python benchmarks/prompt_attention.py [--models bf16,int4] [--rounds 15] [--concurrency 1,8] [--threads 2]
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
PATHS = {"fp32": False, "fp32 A/A": False, "bf16": True}


def pass_cases(lm: LoadedModel) -> dict[str, Callable[[], float]]:
    """Each case: a function timing one pass and undoing what it cached."""
    r = ModelRunner(lm, 10, 2048)
    prompt = [3 + j % 900 for j in range(513)]
    dec = []
    for i in range(8):
        s = r.open([1 + (j * 7 + i) % 1000 for j in range(200)])
        r.forward([RunItem(s, max_run=199)])
        dec.append(s)
    long = r.open(prompt)
    r.forward([RunItem(long, max_run=256)])
    r.cache.reserve(1024)

    def timed(items: list[RunItem]) -> float:
        t = time.perf_counter()
        r.forward(items)
        return time.perf_counter() - t

    def fresh() -> float:
        p = r.open(prompt)
        dt = timed([RunItem(p, max_run=256)])
        r.close(p)
        return dt

    def after() -> float:
        dt = timed([RunItem(long, max_run=256)])
        r.cache.lengths[long.slot] = 256
        return dt

    def beside() -> float:
        p = r.open(prompt)
        dt = timed([RunItem(s, Tree()) for s in dec] + [RunItem(p, max_run=256)])
        for s in dec:
            r.cache.lengths[s.slot] -= 1
        r.close(p)
        return dt

    return {"256 rows, empty cache": fresh, "256 rows after 256": after, "8 decode + 256 rows": beside}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bf16,int4", help="comma list of bf16, int4")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--concurrency", default="", help="closed-loop AR levels to run too (e.g. 1,8)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    console.print(f"{now()}  {machine()}  (bf16 attention on this host: {cpu_ops.resolve('cpu').bf16_attention})")
    ref = load_model("smollm2-135m", quant="none", dtype="fp32")
    ids = ref.tokenizer.encode(" ".join(long_prompts(8)))[:1024]
    levels = [int(x) for x in a.concurrency.split(",") if x]
    for name in a.models.split(","):
        lm = load_model("smollm2-135m", quant="int4" if name == "int4" else "none", dtype="bf16")
        ops = lm.model.ops
        cases = pass_cases(lm)
        prompts = [lm.tokenizer.chat([{"role": "user", "content": p}]) for p in long_prompts(8)]
        sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
        times: dict[tuple[str, str], list[float]] = {}
        for rnd in range(a.rounds + 1):
            for path, on in PATHS.items():
                lm.model.use_ops(replace(ops, bf16_attention=on))
                for case, f in cases.items():
                    dt = f()
                    if rnd:  # round 0 warms up
                        times.setdefault((case, path), []).append(dt)
                if rnd and rnd <= 3:
                    for n in levels:
                        row = run_batched(lm, prompts, sp, n, max(n, a.requests))
                        times.setdefault((f"AR c={n} tok/s", path), []).append(row["tok_s"])
        console.print(ab_table(f"{lm.label}: prompt chunks attending in fp32 vs bf16 ({a.rounds} rounds, medians)",
                               [*cases, *(f"AR c={n} tok/s" for n in levels)], times, *PATHS, levels))
        for path in ("fp32", "bf16"):
            lm.model.use_ops(replace(ops, bf16_attention=PATHS[path]))
            console.print(agreement_line(f"{path} attention", teacher_forced_agreement(ref, lm, ids)))


if __name__ == "__main__":
    main()

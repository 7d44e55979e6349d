"""A prompt's chunk attending in bf16 against fp32 (engine/cpu_ops.Ops.causal_attention), side by side in one process.

On CPU the KV cache is fp32; a bf16 model's entries are bf16 values, so where the CPU computes in bf16 a chunk of
more than LONG_RUN rows attends on them in bf16. Per model (bf16, W4A16), alternating within each round with an
A/A twin of the fp32 path:
  - passes: a 256-row chunk from an empty cache, one after 256 cached tokens, and 8 decode rows beside a 256-row
    chunk (the scheduler's pass while a prompt joins): medians over rounds, ratios to fp32;
  - with --concurrency: closed-loop AR throughput (benchmarks/concurrency.py's run_batched) at each level;
  - the teacher-forced agreement of each path with the fp32 model on ~1000 tokens (what the rounding costs).

    python benchmarks/prompt_attention.py [--models bf16,int4] [--rounds 15] [--concurrency 1,8] [--threads 2]

With --long (issue 54), a long prompt's later chunk instead: the masked call it made before S29 (SDPA with the causal
mask over cache and chunk) against the split it makes now (cpu_ops.cached_then_causal: the cached part in full and
the chunk causally, merged by log-sum-exp), with an A/A twin of the masked call, alternating within each round:
  - one layer's attention at a real model's shape (--model, bf16) for a --chunk-row chunk after each --after length;
  - the whole model's pass over a chunk after the first (its TTFT share), and how many of the chunk's rows keep the
    same top-1 token under either path (the rounding the split adds).

    python benchmarks/prompt_attention.py --long [--model qwen2.5-coder-1.5b --quant int4] [--chunk 2048]
        [--after 2048,6144,14336] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
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
from specledger.engine import cpu_ops, ragged
from specledger.engine.loader import LoadedModel, load_model
from specledger.engine.model import new_slot_cache, ragged_hidden
from specledger.data import quality_text
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


LONG_PATHS = ("masked", "masked A/A", "split")
SPLIT_RUN = cpu_ops.SPLIT_RUN


def use_path(path: str) -> None:
    """Ops.causal_attention reads SPLIT_RUN per call: the split at any chunk size, or the masked call (before S29)
    at every size."""
    cpu_ops.SPLIT_RUN = cpu_ops.LONG_RUN + 1 if path == "split" else 1 << 30


def long_chunks(a: argparse.Namespace) -> None:
    lm = load_model(a.model, dtype="bf16", quant=a.quant)
    m, c, n = lm.model, lm.config, a.chunk
    after = [int(x) for x in a.after.split(",") if x]
    gen = torch.Generator().manual_seed(0)
    times: dict[tuple[str, str], list[float]] = {}
    cases = [f"one layer, {n} rows after {s}" for s in after]
    for s, case in zip(after, cases):
        q = torch.randn(1, c.n_heads, n, c.head_dim, generator=gen).bfloat16()
        kv = [torch.randn(1, c.n_kv_heads, s + n, c.head_dim, generator=gen).bfloat16() for _ in range(2)]
        for rnd in range(a.rounds + 1):
            for path in random.Random(rnd).sample(LONG_PATHS, 3):
                use_path(path)
                t = time.perf_counter()
                m.ops.causal_attention(q, kv[0], kv[1], s, torch.bfloat16)
                if rnd:
                    times.setdefault((case, path), []).append(time.perf_counter() - t)
    whole = f"{a.model} {lm.label}: {n} prompt rows after {n}"
    cache = new_slot_cache(m, 1, 2 * n + 8)
    slot = cache.alloc()
    text = lm.tokenizer.encode(quality_text())
    ids = torch.tensor((text * (2 * n // len(text) + 1))[: 2 * n])
    top: dict[str, torch.Tensor] = {}
    ops = m.ops
    with torch.inference_mode():
        ragged_hidden(m, ids[:n], torch.arange(n), [ragged.Segment(slot, n)], cache)

        def chunk() -> tuple[torch.Tensor, float]:
            """The second chunk's hidden states and seconds, the cache back to the first chunk after."""
            t = time.perf_counter()
            h = ragged_hidden(m, ids[n:], torch.arange(n, 2 * n), [ragged.Segment(slot, n)], cache)
            dt = time.perf_counter() - t
            cache.rollback(slot, n)
            return h, dt

        use_path("masked")  # the reference: the chunk attending in fp32 (the CPU's path without bf16 arithmetic)
        m.use_ops(replace(ops, bf16_attention=False))
        top["fp32"] = m.logits(chunk()[0]).argmax(-1)
        m.use_ops(ops)
        for rnd in range(a.rounds + 1):
            for path in random.Random(100 + rnd).sample(LONG_PATHS, 3):
                use_path(path)
                h, dt = chunk()
                top.setdefault(path, m.logits(h).argmax(-1))
                if rnd:
                    times.setdefault((whole, path), []).append(dt)
    cpu_ops.SPLIT_RUN = SPLIT_RUN
    console.print(ab_table(f"a long prompt's later chunk: masked vs split ({a.rounds} rounds, medians) — "
                           f"{machine()}, {now()}", [*cases, whole], times, *LONG_PATHS, []))
    same = {p: (top[p] == top["fp32"]).float().mean().item() for p in ("masked", "split")}
    console.print(f"  top-1 token of the chunk's {n} rows (built-in text) as with fp32 attention: masked "
                  f"{same['masked']:.2%}, split {same['split']:.2%}; split as masked "
                  f"{(top['split'] == top['masked']).float().mean().item():.2%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bf16,int4", help="comma list of bf16, int4")
    ap.add_argument("--rounds", type=int, default=None, help="default 15, with --long 3")
    ap.add_argument("--concurrency", default="", help="closed-loop AR levels to run too (e.g. 1,8)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--long", action="store_true", help="a long prompt's later chunk: masked vs split (see above)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="with --long")
    ap.add_argument("--quant", default="int4", help="with --long: none, int8 or int4")
    ap.add_argument("--chunk", type=int, default=2048, help="with --long: the chunk's rows (the solo prefill chunk)")
    ap.add_argument("--after", default="2048,6144,14336", help="with --long: cached tokens before the chunk")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.long:
        a.rounds = a.rounds or 3
        long_chunks(a)
        return
    a.rounds = a.rounds or 15
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

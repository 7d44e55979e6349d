"""Autoregressive decoding under concurrency on the continuous-batching scheduler: aggregate output
tok/s, ITL p50/p95 and TTFT p50 at concurrency 1, 2, 4, 8 (closed loop: N requests in flight, a
new one submitted as each finishes), for the engine in fp32 / bf16 / W4A16. The first row of each
precision is the one-request-at-a-time path (generate()), so the scheduler's batch-1 overhead and
the batching gain are both read off one table.

    python benchmarks/concurrency.py [--precisions fp32,bf16,int4] [--concurrency 1,2,4,8]
        [--new-tokens 64] [--requests 16] [--prefill-chunk 256] [--threads N] [--json out.json]

Every request generates exactly --new-tokens tokens (eos ignored) from a ~100-300-token prompt.
Not yet here (issue 11): speculation methods, and llama-server driven through
`specledger bench --backend openai`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from common import long_prompts, machine, now  # noqa: E402

from specledger.decoding.factory import make_strategy  # noqa: E402
from specledger.decoding.generate import generate  # noqa: E402
from specledger.decoding.sampling import SamplingParams  # noqa: E402
from specledger.decoding.scheduler import Scheduler  # noqa: E402
from specledger.engine.loader import default_dtype, load_model  # noqa: E402

console = Console(width=160)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def summarize(label: str, n: int, results: list, wall: float) -> dict:
    itl = [b - a for r in results for a, b in zip(r.token_times, r.token_times[1:])]
    toks = sum(len(r.token_ids) for r in results)
    return {"level": label, "concurrency": n, "requests": len(results), "tokens": toks, "wall_s": wall,
            "tok_s": toks / wall, "itl_p50_ms": 1e3 * pct(itl, 0.5), "itl_p95_ms": 1e3 * pct(itl, 0.95),
            "ttft_p50_ms": 1e3 * statistics.median(r.ttft_s for r in results)}


def run_serial(lm, prompts: list[list[int]], sp: SamplingParams, n_requests: int) -> dict:
    strategy = make_strategy("ar", target=lm)
    results = []
    t0 = time.perf_counter()
    for i in range(n_requests):
        results.append(generate(strategy, prompts[i % len(prompts)], sp))
    return summarize("generate() one at a time", 1, results, time.perf_counter() - t0)


def run_batched(lm, prompts: list[list[int]], sp: SamplingParams, n: int, n_requests: int, chunk: int = 256) -> dict:
    s = Scheduler(lm, max_batch=n, prefill_chunk=chunk)
    submitted = 0
    results = []
    t0 = time.perf_counter()
    while submitted < min(n, n_requests):
        s.submit(prompts[submitted % len(prompts)], sp)
        submitted += 1
    batches = []
    while s.has_work():
        done = s.step()
        batches.append(s.last_batch)
        results.extend(done)
        for _ in done:  # closed loop: a new request as each finishes
            if submitted < n_requests:
                s.submit(prompts[submitted % len(prompts)], sp)
                submitted += 1
    row = summarize(f"scheduler c={n}", n, results, time.perf_counter() - t0)
    row["mean_batch"] = statistics.mean(batches)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precisions", default="fp32,bf16,int4", help="comma list of fp32, bf16, int4")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    ap.add_argument("--prefill-chunk", type=int, default=256, help="prompt rows per pass at most")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    levels = [int(x) for x in a.concurrency.split(",")]
    console.print(f"{now()}  {machine()}")
    sp = SamplingParams(max_new_tokens=a.new_tokens, ignore_eos=True)
    out = {"machine": machine(), "date": now(), "new_tokens": a.new_tokens, "precisions": {}}
    for prec in a.precisions.split(","):
        quant = "int4" if prec == "int4" else "none"
        lm = load_model("smollm2-135m", quant=quant, dtype=default_dtype(quant) if quant != "none" else prec)
        prompts = [lm.tokenizer.chat([{"role": "user", "content": p}]) for p in long_prompts(8)]
        run_batched(lm, prompts, SamplingParams(max_new_tokens=4, ignore_eos=True), 2, 2)  # warm-up
        rows = [run_serial(lm, prompts, sp, max(4, a.requests // 2))]
        for n in levels:
            rows.append(run_batched(lm, prompts, sp, n, max(n, a.requests), a.prefill_chunk))
        base = rows[1]["tok_s"] if len(rows) > 1 else rows[0]["tok_s"]
        t = Table(title=f"AR under concurrency: {lm.label}")
        for col in ("level", "mean batch", "tok/s", f"x c={levels[0]}", "ITL p50 ms", "ITL p95 ms", "TTFT p50 ms"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(r["level"], f"{r.get('mean_batch', 1.0):.2f}", f"{r['tok_s']:.1f}", f"{r['tok_s'] / base:.2f}",
                      f"{r['itl_p50_ms']:.1f}", f"{r['itl_p95_ms']:.1f}", f"{r['ttft_p50_ms']:.0f}")
        console.print(t)
        out["precisions"][lm.label] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

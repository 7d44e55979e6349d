"""The hierarchy (hier) on the continuous-batching scheduler: throughput at concurrency 4 over concurrency 1.

Issue 44's goal for batched hier: closed-loop, end-to-end tok/s at c=4 at least 1.5x that at c=1 on the
embedded model. The target is smollm2-135m (--precision), the intermediate its W4A16 copy, the drafter below it
prompt lookup (concurrency.py's "hier"). Interleaved: --rounds rounds,
each visiting every (concurrency, contender) in a fresh random order, where the contenders are "hier" and its A/A
twin "hier-aa" (the same configuration run again: its ratio to "hier" is the noise floor). Per round, each
contender's c=4 / c=1 (paired by round; geometric mean and 95% bootstrap interval over rounds), and at each
concurrency hier-aa / hier. Closed loop as in concurrency.py: N requests in flight, a new one as each finishes,
--requests per level, each exactly --new-tokens tokens (eos ignored) from a ~100-300-token prompt.

    python benchmarks/hier_batch.py [--precision fp32] [--concurrency 1,4] [--rounds 5]
        [--requests 16] [--new-tokens 64] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from common import long_prompts, machine, now  # noqa: E402
from concurrency import ratio_ci, run_batched  # noqa: E402

from specledger.decoding.sampling import SamplingParams  # noqa: E402
from specledger.engine.loader import load_model  # noqa: E402

console = Console(width=160)
CONTENDERS = ("hier", "hier-aa")


def run_rounds(lm, prompts, sp, levels: list[int], rounds: int, n_requests: int, chunk: int, seed: int = 0
               ) -> list[dict]:
    rng = random.Random(seed)
    rows: list[dict] = []
    for rnd in range(rounds):
        cells = [(n, m) for n in levels for m in CONTENDERS]
        rng.shuffle(cells)
        for n, m in cells:
            row = run_batched(lm, prompts, sp, n, max(n, n_requests), chunk, method="hier")
            row.update(method=m, round=rnd)
            rows.append(row)
            console.print(f"  round {rnd} c={n} {m}: {row['tok_s']:.1f} tok/s, tau {row['tau']:.2f}")
    return rows


def report(label: str, rows: list[dict], levels: list[int]) -> dict:
    t = Table(title=f"hier on the scheduler (interleaved, paired by round): {label}")
    for col in ("c", "contender", "tok/s (median)", "tau", "acceptance", "mean batch", "hier-aa / hier [95% CI]"):
        t.add_column(col, justify="right")
    tok = {(r["concurrency"], r["method"], r["round"]): r["tok_s"] for r in rows}
    rounds = sorted({r["round"] for r in rows})
    for n in levels:
        for m in CONTENDERS:
            mine = [r for r in rows if r["concurrency"] == n and r["method"] == m]
            acc = [r["acceptance"] for r in mine if r["acceptance"] is not None]
            aa = ""
            if m == "hier-aa":
                g, lo, hi = ratio_ci([(tok[(n, "hier-aa", k)], tok[(n, "hier", k)]) for k in rounds])
                aa = f"{g:.3f} [{lo:.3f}, {hi:.3f}]"
            t.add_row(str(n), m, f"{statistics.median(r['tok_s'] for r in mine):.1f}",
                      f"{statistics.median(r['tau'] for r in mine):.2f}",
                      f"{statistics.median(acc):.2f}" if acc else "-",
                      f"{statistics.median(r['mean_batch'] for r in mine):.2f}", aa)
    console.print(t)
    lo_c, hi_c = levels[0], levels[-1]
    scaling = {}
    for m in CONTENDERS:
        g, lo, hi = ratio_ci([(tok[(hi_c, m, k)], tok[(lo_c, m, k)]) for k in rounds])
        scaling[m] = {"ratio": g, "ci": [lo, hi]}
        console.print(f"{m}: c={hi_c} / c={lo_c} tok/s = {g:.2f}x [{lo:.2f}, {hi:.2f}] (goal >= 1.5x)")
    return scaling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="the target's (the "
                    "intermediate is the W4A16 copy)")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefill-chunk", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    levels = [int(x) for x in a.concurrency.split(",")]
    if len(levels) < 2 or a.rounds < 2:
        sys.exit("error: --concurrency needs two levels or more and --rounds at least 2 (ratios are paired by round)")
    lm = load_model("smollm2-135m", dtype=a.precision)
    console.print(f"{now()}  {machine()}")
    prompts = [lm.tokenizer.chat([{"role": "user", "content": p}]) for p in long_prompts(8)]
    run_batched(lm, prompts, SamplingParams(max_tokens=4, ignore_eos=True), 2, 2, method="hier")  # warm-up
    sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
    rows = run_rounds(lm, prompts, sp, levels, a.rounds, a.requests, a.prefill_chunk)
    scaling = report(f"{lm.label}, intermediate W4A16, drafter lookup, {a.new_tokens} tokens", rows, levels)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine(), "date": now(), "args": vars(a), "rows": rows, "scaling": scaling}, f,
                      indent=2)


if __name__ == "__main__":
    main()

"""Autoregressive decoding under concurrency on the continuous-batching scheduler: aggregate output
tok/s, ITL p50/p95 and TTFT p50 at concurrency 1, 2, 4, 8 (closed loop: N requests in flight, a
new one submitted as each finishes), for the engine in fp32 / bf16 / W4A16. The first row of each
precision is generate() one request at a time (the scheduler holding one sequence, no prefix cache), so
the batching gain is read off one table.

    python benchmarks/concurrency.py [--precisions fp32,bf16,int4] [--concurrency 1,2,4,8]
        [--new-tokens 64] [--requests 16] [--prefill-chunk 256] [--threads N] [--json out.json]

Every request generates exactly --new-tokens tokens (eos ignored) from a ~100-300-token prompt.

With --methods (e.g. ar,ar-aa,lookup,lookup-k3,draft,eagle) the contenders run side by side on the scheduler
instead, interleaved: --rounds rounds, each visiting every concurrency with the contenders in a
fresh random order, so machine drift hits all alike. "ar-aa" is AR run again (the A/A pair: its
ratio to "ar" is the noise floor); "lookup" is prompt lookup with the draft length planned per
sequence per step from the measured cost surface T(rows) (decoding/sizing/planner.py); "lookup-k3"
drafts whatever lookup finds, up to 3 tokens, every step (no planning: what speculation without
the cost surface does under load); "draft" a chain from the W4A16 copy of the target (not on a W4A16
target: that would be the target itself) and "eagle" the shipped EAGLE head, "hier" prompt lookup under the
W4A16 copy as intermediate (not on a W4A16 target either), all batched and planned per sequence per step like
lookup; "draft-ownkv" and "hier-ownkv" the same with the copy prefilling each prompt itself (share_prompt_kv off:
it copies the target's prompt entries by default). Per concurrency: median tok/s over rounds, and each method's
ratio to "ar" paired by round (geometric mean, 95% bootstrap interval over rounds); a difference
is real only where the interval excludes 1 and the A/A interval is tight.

    python benchmarks/concurrency.py --methods ar,ar-aa,lookup,lookup-k3 --precisions fp32,int4 \
        --concurrency 1,2,4,8,16 --rounds 5 --requests 16 --new-tokens 64 --json conc.json

With --servers the contenders are HTTP servers instead, side by side in one run per precision with llama.cpp's
server on the same GGUF (benchmarks/concurrency_servers.py): `specledger serve` for each --methods entry (ar,
ar-aa, lookup, draft, eagle; the server batches all of them) and
`llama-server --parallel <max concurrency>` for each --llama entry (ar, ar-aa, ngram = its --spec-type
ngram-simple), each a managed server driven by `specledger bench --backend openai`, interleaved:

    python benchmarks/concurrency.py --servers --precisions fp32,bf16,int4 --methods ar,ar-aa,lookup,draft,eagle \
        --llama ar,ar-aa,ngram --concurrency 1,2,4,8,16 --requests 16 --new-tokens 64 --out conc-servers
    python benchmarks/concurrency.py --servers --quick        # int4, ar/ar-aa/lookup vs llama ar/ngram, c=1,4

Needs llama-server (`make llama-server`). Each run directory stays under --out for `specledger show|report`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from common import long_prompts, machine, now  # noqa: E402

from specledger.decoding.factory import make_strategy  # noqa: E402
from specledger.decoding.sizing.planner import cost_surface  # noqa: E402
from specledger.decoding.loop.generate import generate  # noqa: E402
from specledger.decoding.drafters.lookup import LookupDrafter  # noqa: E402
from specledger.decoding.sampling import SamplingParams  # noqa: E402
from specledger.decoding.loop.scheduler import Scheduler  # noqa: E402
from specledger.engine.loader import default_dtype, load_model  # noqa: E402

console = Console(width=160)
# in-process methods batched through a strategy's own drafter (the draft model: the target's W4A16 copy)
BATCH_METHODS = {"draft": {"draft": {"model": "target", "quant": "int4", "dtype": "bf16"}}, "eagle": {},
                 "hier": {"intermediate": {"model": "target", "quant": "int4", "dtype": "bf16"}, "drafter": "lookup"}}
# the same with the self-draft prefilling the prompt itself rather than copying the target's entries (share_prompt_kv)
BATCH_METHODS |= {f"{m}-ownkv": BATCH_METHODS[m] | {"share_prompt_kv": False} for m in ("draft", "hier")}
METHODS = ("ar", "ar-aa", "lookup", "lookup-k3", *BATCH_METHODS)


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


def run_batched(lm, prompts: list[list[int]], sp: SamplingParams, n: int, n_requests: int, chunk: int = 256,
                method: str = "ar") -> dict:
    drafter, cost = None, None
    if method.startswith("lookup"):
        drafter = LookupDrafter(3 if method == "lookup-k3" else 8)
        cost = (lambda rows: 1.0) if method == "lookup-k3" else None  # a flat cost: draft all it finds
    elif method in BATCH_METHODS:
        drafter = make_strategy(method.removesuffix("-ownkv"), target=lm, **BATCH_METHODS[method]).batch_drafter(n)
    s = Scheduler(lm, max_batch=n, prefill_chunk=chunk, drafter=drafter, cost=cost)
    planned: list[int] = []  # draft tokens of each pass's plan
    if s.spec is not None:
        plan = s.spec.plan

        def counted(*args):
            trees = plan(*args)
            planned.append(sum(len(t) for t in trees))
            return trees

        s.spec.plan = counted
    submitted = 0
    results = []
    t0 = time.perf_counter()
    while submitted < min(n, n_requests):
        s.add(prompts[submitted % len(prompts)], sp)
        submitted += 1
    batches, drafted = [], []
    while s.has_work():
        done = s.step()
        batches.append(s.last_batch)
        drafted.append((planned.pop() if planned else 0) / max(1, s.last_batch))
        results.extend(done)
        for _ in done:  # closed loop: a new request as each finishes
            if submitted < n_requests:
                s.add(prompts[submitted % len(prompts)], sp)
                submitted += 1
    row = summarize(f"scheduler c={n}", n, results, time.perf_counter() - t0)
    row["mean_batch"] = statistics.mean(batches)
    row["method"] = method
    row["drafted_per_seq"] = statistics.mean(drafted)
    levels = [r.levels[-1] for r in results if r.levels]  # what the target verified (a hierarchy's top level)
    proposed = sum(lv.proposed for lv in levels)
    row["acceptance"] = sum(lv.accepted for lv in levels) / proposed if proposed else None
    row["tau"] = sum(r.appended for r in results) / max(1, sum(r.steps for r in results))
    return row


def ratio_ci(pairs: list[tuple[float, float]], reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of a/b over paired rounds, with a 95% bootstrap interval over rounds."""
    logs = [math.log(a / b) for a, b in pairs]
    rng = random.Random(seed)
    boot = sorted(statistics.mean(rng.choices(logs, k=len(logs))) for _ in range(reps))
    return math.exp(statistics.mean(logs)), math.exp(boot[int(0.025 * reps)]), math.exp(boot[int(0.975 * reps) - 1])


def run_methods(lm, prompts, sp, methods: list[str], levels: list[int], rounds: int, n_requests: int,
                chunk: int, seed: int = 0) -> list[dict]:
    """Interleaved: every round visits every concurrency with the methods in a fresh random order."""
    rng = random.Random(seed)
    rows: list[dict] = []
    for rnd in range(rounds):
        for n in levels:
            order = list(methods)
            rng.shuffle(order)
            for m in order:
                real = "ar" if m == "ar-aa" else m
                row = run_batched(lm, prompts, sp, n, max(n, n_requests), chunk, method=real)
                row.update(method=m, round=rnd)
                rows.append(row)
    return rows


def methods_table(label: str, rows: list[dict], methods: list[str], levels: list[int]) -> Table:
    t = Table(title=f"Speculation under concurrency (interleaved, paired by round): {label}")
    for col in ("c", "method", "tok/s (median)", "x ar [95% CI]", "tau", "acceptance", "drafted/seq/pass",
                "ITL p50 ms", "ITL p95 ms"):
        t.add_column(col, justify="right")
    for n in levels:
        base = {r["round"]: r["tok_s"] for r in rows if r["concurrency"] == n and r["method"] == "ar"}
        for m in methods:
            mine = [r for r in rows if r["concurrency"] == n and r["method"] == m]
            if not mine:
                continue
            acc = [r["acceptance"] for r in mine if r["acceptance"] is not None]
            if m == "ar":
                ratio = "1"
            else:
                g, lo, hi = ratio_ci([(r["tok_s"], base[r["round"]]) for r in mine])
                ratio = f"{g:.3f} [{lo:.3f}, {hi:.3f}]"
            t.add_row(str(n), m, f"{statistics.median(r['tok_s'] for r in mine):.1f}", ratio,
                      f"{statistics.median(r['tau'] for r in mine):.2f}",
                      f"{statistics.median(acc):.2f}" if acc else "-",
                      f"{statistics.median(r['drafted_per_seq'] for r in mine):.2f}",
                      f"{statistics.median(r['itl_p50_ms'] for r in mine):.1f}",
                      f"{statistics.median(r['itl_p95_ms'] for r in mine):.1f}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precisions", default="fp32,bf16,int4", help="comma list of fp32, bf16, int4")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    ap.add_argument("--prefill-chunk", type=int, default=256, help="prompt rows per pass at most")
    ap.add_argument("--methods", default=None,
                    help="comma list of ar, ar-aa, lookup, lookup-k3, draft(-ownkv), eagle, hier(-ownkv): side by side, interleaved "
                         "(see the docstring)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="with --methods: interleaved rounds (default 3); with --servers: passes over the workload per level (default 1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (in-process runs only)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--servers", action="store_true",
                    help="HTTP servers side by side with llama-server (see the docstring)")
    ap.add_argument("--llama", default="ar,ar-aa,ngram", help="with --servers: llama-server configurations "
                    "(ar, ar-aa, ngram; empty for none)")
    ap.add_argument("--quick", action="store_true", help="with --servers: int4 only, ar,ar-aa,lookup vs llama ar,ngram, "
                    "c=1,4, 8 requests of 32 tokens")
    ap.add_argument("--out", default=None, help="with --servers: folder for the run directories (default: a new one)")
    a = ap.parse_args()
    if a.servers:
        run_servers(a)
        return
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: --device cuda: no CUDA device is available")
    if a.threads:
        torch.set_num_threads(a.threads)
    levels = [int(x) for x in a.concurrency.split(",")]
    console.print(f"{now()}  {machine()}")
    sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
    out = {"machine": machine(), "date": now(), "new_tokens": a.new_tokens, "precisions": {}}
    for prec in a.precisions.split(","):
        quant = "int4" if prec == "int4" else "none"
        lm = load_model("smollm2-135m", quant=quant, dtype=default_dtype(quant) if quant != "none" else prec,
                        device=a.device)
        prompts = [lm.tokenizer.chat([{"role": "user", "content": p}]) for p in long_prompts(8)]
        run_batched(lm, prompts, SamplingParams(max_tokens=4, ignore_eos=True), 2, 2)  # warm-up
        if a.methods:
            methods = a.methods.split(",")
            unknown = set(methods) - set(METHODS)
            if unknown or "ar" not in methods:
                sys.exit(f"error: --methods takes {', '.join(METHODS)} and must include ar (got {a.methods!r})")
            if quant == "int4":  # a draft (intermediate) from the W4A16 copy of a W4A16 target is the target itself
                methods = [m for m in methods if m.removesuffix("-ownkv") not in ("draft", "hier")]
            surface = cost_surface(lm, max_rows=4 * max(levels), n_seqs=min(8, max(levels)))  # before timing
            console.print(f"cost surface {lm.label}: " + ", ".join(
                f"T({r})={1e3 * t:.1f}ms" for r, t in zip(surface.rows, surface.seconds)))
            rows = run_methods(lm, prompts, sp, methods, levels, a.rounds or 3, a.requests, a.prefill_chunk)
            console.print(methods_table(lm.label, rows, methods, levels))
            out["precisions"][lm.label] = {"surface": dict(zip(surface.rows, surface.seconds)), "rows": rows}
            continue
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


def run_servers(a: argparse.Namespace) -> None:
    import tempfile
    from pathlib import Path

    import concurrency_servers as cs

    if a.quick:
        a.precisions, a.methods, a.llama, a.concurrency, a.requests, a.new_tokens = (
            "int4", "ar,ar-aa,lookup", "ar,ngram", "1,4", 8, 32)
    methods = (a.methods or "ar,ar-aa,lookup").split(",")
    llama = [m for m in a.llama.split(",") if m]
    bad = [m for m in methods if m not in cs.SERVE_METHODS] + [m for m in llama if m not in cs.LLAMA_METHODS]
    bad += [p for p in a.precisions.split(",") if p not in cs.PRECISION_FLAGS]
    if bad or "ar" not in methods:
        sys.exit(f"error: unknown {bad} (methods {sorted(cs.SERVE_METHODS)}, llama {sorted(cs.LLAMA_METHODS)}, "
                 f"precisions {sorted(cs.PRECISION_FLAGS)}); --methods must include ar")
    if llama:
        from specledger.bench.managed import find_llama_server

        if find_llama_server() is None:
            sys.exit("error: no llama-server binary: `make llama-server` (or --llama '' to leave it out)")
    levels = [int(x) for x in a.concurrency.split(",")]
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="conc-servers-"))
    out.mkdir(parents=True, exist_ok=True)
    threads = a.threads or os.cpu_count() or 1
    wl = cs.workload(out / "prompts.jsonl", long_prompts(8), a.new_tokens)
    console.print(f"{now()}  {machine()}  -> {out}")
    result: dict = {"machine": machine(), "date": now(), "new_tokens": a.new_tokens, "threads": threads,
                    "precisions": {}}
    for i, prec in enumerate(a.precisions.split(",")):
        cfg = cs.run_config(prec, methods, llama, levels, requests=a.requests, new_tokens=a.new_tokens,
                            threads=threads, repeats=a.rounds or 1, wl=wl, seed=i)
        rows = cs.with_ratios(cs.rows_of(cs.bench(cfg, out, f"servers-{prec}")))
        cs.print_table(f"Servers under concurrency: specledger serve {prec} vs llama-server (Q4_1 GGUF), "
                       f"{a.new_tokens} tokens per answer, {threads} threads each", rows)
        console.print(cs.summary(rows))
        result["precisions"][prec] = {"run_dir": str(out / f"servers-{prec}"), "rows": rows}
    path = Path(a.json) if a.json else out / "concurrency_servers.json"
    path.write_text(json.dumps(result, indent=2))
    console.print(f"results: {path}")


if __name__ == "__main__":
    main()

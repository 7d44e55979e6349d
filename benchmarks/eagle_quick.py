"""Quick check of the shipped EAGLE head: tau, acceptance and decode speed vs autoregressive.

On the embedded model's fp32, bf16 and int4 targets, greedy, one prompt of each of the six
task kinds (the built-in workload's first turns), autoregressive and EAGLE alternating on
every prompt so that both see the same machine load.

    python benchmarks/eagle_quick.py [--new-tokens 128] [--total-nodes auto] [--targets fp32,bf16,int4]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specledger.decoding.autoregressive import Autoregressive
from specledger.decoding.eagle import EagleTree
from specledger.decoding.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.engine.loader import load_model

WORKLOAD = Path(__file__).resolve().parent.parent / "src" / "specledger" / "data" / "workloads" / "builtin.jsonl"
KINDS = ("writing", "translation", "summarization", "qa", "math_reasoning", "rag")
TARGETS = {"fp32": dict(dtype="fp32"), "bf16": dict(dtype="bf16"), "int4": dict(dtype="bf16", quant="int4")}


def prompts() -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for line in WORKLOAD.read_text().splitlines():
        q = json.loads(line)
        if q["category"] in KINDS and q["category"] not in seen:
            seen[q["category"]] = q["turns"][0]
    return [(k, seen[k]) for k in KINDS if k in seen]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--total-nodes", default="auto")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--head", default=None, help="head directory (default: the shipped one)")
    ap.add_argument("--targets", default="fp32,bf16,int4")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nodes = args.total_nodes if args.total_nodes == "auto" else int(args.total_nodes)
    sp = SamplingParams(max_new_tokens=args.new_tokens)
    work = prompts()
    names = args.targets.split(",")
    lms = {n: load_model("smollm2-135m", **TARGETS[n]) for n in names}
    ids = [(k, lms[names[0]].tokenizer.chat([{"role": "user", "content": p}])) for k, p in work]
    strategies = {}
    for n, lm in lms.items():
        strategies[n] = (Autoregressive(lm), EagleTree(lm, head=args.head, top_k=args.top_k, depth=args.depth, total_nodes=nodes))
        for s in strategies[n]:  # warm-up (first calls allocate, EAGLE measures the verification curve)
            generate(s, ids[0][1], SamplingParams(max_new_tokens=8))
    rows = {n: {"ar": [], "eagle": []} for n in names}
    t0 = time.perf_counter()
    for kind, p in ids:
        for n in names:  # alternate: AR then EAGLE for each target and prompt
            ar, eg = strategies[n]
            rows[n]["ar"].append((kind, generate(ar, p, sp)))
            rows[n]["eagle"].append((kind, generate(eg, p, sp)))
    wall = time.perf_counter() - t0

    def decode_rate(results) -> float:
        toks = sum(len(r.token_ids) - 1 for _, r in results)
        secs = sum(r.total_s - r.ttft_s for _, r in results)
        return toks / secs

    print(f"smollm2-135m, greedy, {args.new_tokens} new tokens, {len(ids)} prompts ({', '.join(k for k, _ in ids)}), "
          f"top_k {args.top_k}, depth {args.depth}, total_nodes {args.total_nodes}, {torch.get_num_threads()} threads")
    hdr = f"{'target':7} {'tau':>5} {'accept':>7} {'nodes':>6} {'AR tok/s':>9} {'EAGLE tok/s':>12} {'speed-up':>9} {'identical':>10}  per-prompt tau"
    print(hdr)
    for n in names:
        ar, eg = rows[n]["ar"], rows[n]["eagle"]
        steps = sum(r.steps for _, r in eg)
        tau = sum(r.appended for _, r in eg) / steps
        prop = sum(r.levels[0].proposed for _, r in eg)
        acc = sum(r.levels[0].accepted for _, r in eg)
        same = sum(a.token_ids == e.token_ids for (_, a), (_, e) in zip(ar, eg))
        ra, re_ = decode_rate(ar), decode_rate(eg)
        per = " ".join(f"{k[:5]}:{r.tau:.2f}" for k, r in eg)
        p = strategies[n][1].params()
        print(f"{n:7} {tau:5.2f} {acc / prop:7.1%} {prop / steps:6.1f} {ra:9.1f} {re_:12.1f} {re_ / ra:8.2f}x {same:>4}/{len(eg):<5}  {per}")
        if "verify_curve_ms" in p:
            print(f"        auto tree size: last {p['auto_nodes']}, mean {p['auto_nodes_mean']}; verify ms "
                  + " ".join(f"{k}:{v:.0f}" for k, v in p["verify_curve_ms"].items()))
        for (k, a), (_, e) in zip(ar, eg):
            if a.token_ids != e.token_ids:
                first = next((i for i, (x, y) in enumerate(zip(a.token_ids, e.token_ids)) if x != y),
                             min(len(a.token_ids), len(e.token_ids)))
                print(f"        {k}: first divergence from AR at output token {first}")
    print(f"wall {wall:.0f} s")


if __name__ == "__main__":
    main()

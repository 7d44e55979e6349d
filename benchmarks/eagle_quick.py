"""Quick check of the shipped EAGLE head: tau, acceptance and decode speed vs autoregressive.

On the embedded model's fp32, bf16 and int4 targets, greedy, one prompt of each of the six
task kinds (the built-in workload's first turns). On every prompt, for every target, the
autoregressive run and the EAGLE runs follow each other, so all see the same machine load.
EAGLE rows: the tree size chosen automatically ("auto") and a fixed 60-node tree; on the fp32
target also the head in fp32 (by default an fp32 target on a bf16-capable CPU drafts with a bf16
head: drafts are only proposals, so it stays lossless and drafting costs about half).

    python benchmarks/eagle_quick.py [--new-tokens 128] [--threads 1] [--targets fp32,bf16,int4]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specledger.decoding.autoregressive import Autoregressive
from specledger.decoding.drafters.eagle import EagleTree
from specledger.decoding.loop.generate import generate
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


def decode_rate(results) -> float:
    toks = sum(len(r.token_ids) - 1 for r in results)
    return toks / sum(r.total_s - r.ttft_s for r in results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--head", default=None, help="head directory (default: the shipped one)")
    ap.add_argument("--targets", default="fp32,bf16,int4")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sp = SamplingParams(max_tokens=args.new_tokens)
    work = prompts()
    names = args.targets.split(",")
    lms = {n: load_model("smollm2-135m", **TARGETS[n]) for n in names}
    ids = [(k, lms[names[0]].tokenizer.chat([{"role": "user", "content": p}])) for k, p in work]
    tree = dict(head=args.head, top_k=args.top_k, depth=args.depth)
    runs: dict[str, dict[str, object]] = {}
    for n, lm in lms.items():
        runs[n] = {"ar": Autoregressive(lm), "eagle auto": EagleTree(lm, max_nodes="auto", **tree),
                   "eagle 60": EagleTree(lm, max_nodes=60, **tree)}
        if lm.dtype == "fp32":
            runs[n]["eagle auto, fp32 head"] = EagleTree(lm, max_nodes="auto", head_dtype="fp32", **tree)
        for s in runs[n].values():  # warm-up (first calls allocate; EAGLE auto measures the verification curve)
            generate(s, ids[0][1], SamplingParams(max_tokens=8))
    res = {n: {v: [] for v in runs[n]} for n in names}
    t0 = time.perf_counter()
    for _, p in ids:
        for n in names:
            for v, s in runs[n].items():
                res[n][v].append(generate(s, p, sp))
    wall = time.perf_counter() - t0

    print(f"smollm2-135m, greedy, {args.new_tokens} new tokens, {len(ids)} prompts ({', '.join(k for k, _ in ids)}); "
          f"top_k {args.top_k}, depth {args.depth}; {torch.get_num_threads()} thread(s)")
    print(f"{'target':6} {'strategy':22} {'tau':>5} {'accept':>7} {'nodes':>6} {'draft':>6} {'verify':>7} {'tok/s':>7} "
          f"{'speed-up':>9} {'same as AR':>10}  per-prompt tau   (draft, verify: ms per step)")
    for n in names:
        ar = res[n]["ar"]
        ra = decode_rate(ar)
        ms = 1000 * sum(r.verify_s for r in ar) / sum(r.steps for r in ar)
        print(f"{n:6} {'ar':22} {1:5.2f} {'':>7} {'':>6} {'':>6} {ms:7.1f} {ra:7.1f} {1:8.2f}x")
        for v in runs[n]:
            if v == "ar":
                continue
            eg = res[n][v]
            steps = sum(r.steps for r in eg)
            prop = sum(r.levels[0].proposed for r in eg)
            acc = sum(r.levels[0].accepted for r in eg)
            same = sum(a.token_ids == e.token_ids for a, e in zip(ar, eg))
            re_ = decode_rate(eg)
            per = " ".join(f"{k[:5]}:{r.tau:.2f}" for (k, _), r in zip(ids, eg))
            d_ms, v_ms = (1000 * sum(getattr(r, f) for r in eg) / steps for f in ("draft_s", "verify_s"))
            print(f"{n:6} {v:22} {sum(r.appended for r in eg) / steps:5.2f} {acc / prop:7.1%} {prop / steps:6.1f} "
                  f"{d_ms:6.1f} {v_ms:7.1f} {re_:7.1f} {re_ / ra:8.2f}x {same:>5}/{len(eg):<4}  {per}")
            for (k, _), a, e in zip(ids, ar, eg):
                if a.token_ids != e.token_ids:
                    first = next((i for i, (x, y) in enumerate(zip(a.token_ids, e.token_ids)) if x != y),
                                 min(len(a.token_ids), len(e.token_ids)))
                    print(f"{'':29}{k}: first divergence from AR at output token {first}")
    print(f"wall {wall:.0f} s")


if __name__ == "__main__":
    main()

"""Concurrency 1: generate() on the scheduler (this checkout) against the single-sequence loop it replaced.

Issue 44 item 1 made generate() a Scheduler holding one sequence; this checks that a request alone is not
slower for it. Three arms, each a worker process that loads the model once and decodes the same prompts:
`new-a` and `new-b` run this checkout's src (an A/A pair: their spread is the noise of the host), `old` runs the
src of a git worktree of the commit before (default /tmp/old55: `git worktree add /tmp/old55 55ce68e`). Rounds
interleave the arms in a rotating order, so drift over the run touches every arm alike. Greedy tokens are
compared across arms (they must be equal: the same verifier, the same model).

    python benchmarks/one_loop_ab.py [--old /tmp/old55/src] [--strategies ar,lookup] [--rounds 5]
        [--prompts 4] [--new-tokens 64] [--quant none] [--dtype bf16] [--threads 2] [--draft-length fixed]
    python benchmarks/one_loop_ab.py --smoke     # tiny sizes: does it run

Per arm: the median over rounds of decode tok/s (tokens after the first over the time after it) and TTFT.
new/old is the ratio of medians; the A/A ratio new-a/new-b says how far the host alone moves it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Explain why the sky is blue.", "Write a Python function that reverses a list.",
           "List three uses of copper.", "Summarise the plot of Hamlet in two sentences.",
           "What is the capital of Australia, and why was it chosen?", "Translate 'good morning' into French."]


def worker(a: argparse.Namespace) -> None:
    """Load once; for every line on stdin, decode the prompts with one strategy and print one JSON line."""
    import torch

    from specledger.decoding.factory import make_strategy
    from specledger.decoding.loop.generate import generate
    from specledger.decoding.sampling import SamplingParams
    from specledger.engine.loader import load_model

    torch.set_num_threads(a.threads)
    lm = load_model(a.model, dtype=a.dtype, quant=a.quant)
    prompts = [lm.tokenizer.chat([{"role": "user", "content": p}]) for p in PROMPTS[: a.prompts]]
    strategies: dict = {}
    limit = "max_new_tokens" if a.arm == "old" else "max_tokens"  # (the old tree's name for it)
    sp = SamplingParams(**{limit: a.new_tokens}, ignore_eos=True)
    for line in sys.stdin:
        name = line.strip()
        if name not in strategies:
            params = {"max_nodes": 3} if name == "lookup" else {}
            if a.draft_length and name != "ar" and a.arm != "old":  # (the old loop had no such parameter)
                params["draft_length"] = a.draft_length
            strategies[name] = make_strategy(name, lm, **params)
            generate(strategies[name], prompts[0], SamplingParams(**{limit: 4}))  # warm-up: probes, caches
        out = []
        for ids in prompts:
            r = generate(strategies[name], ids, sp)
            decode = r.total_s - r.ttft_s
            out.append({"ttft_s": r.ttft_s, "decode_tok_s": (len(r.token_ids) - 1) / decode if decode > 0 else 0.0,
                        "tau": r.tau, "ids": r.token_ids})
        print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="/tmp/old55/src", help="src of the checkout to compare with")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--strategies", default="ar,lookup")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-length", default=None, help="the new arms' draft_length (fixed | adaptive)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: 1 round, 1 prompt, 8 tokens")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if a.smoke:
        a.rounds, a.prompts, a.new_tokens = 1, 1, 8
    if not (Path(a.old) / "specledger").is_dir():
        sys.exit(f"no specledger under {a.old}: make it with `git worktree add /tmp/old55 55ce68e`")
    srcs = {"new-a": str(ROOT / "src"), "new-b": str(ROOT / "src"), "old": a.old}
    args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
            if k in ("model", "dtype", "quant", "prompts", "new_tokens", "threads") or (k == "draft_length" and v)]
    procs = {arm: subprocess.Popen([sys.executable, __file__, "--worker", f"--arm={arm}", *args], text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env={**os.environ, "PYTHONPATH": src}) for arm, src in srcs.items()}
    arms = list(procs)
    got: dict[tuple[str, str], list[list[dict]]] = {}
    try:
        for r in range(a.rounds):
            for name in a.strategies.split(","):
                for arm in arms[r % len(arms):] + arms[: r % len(arms)]:  # a rotating order
                    p = procs[arm]
                    assert p.stdin is not None and p.stdout is not None
                    p.stdin.write(name + "\n")
                    p.stdin.flush()
                    line = p.stdout.readline()
                    if not line:
                        sys.exit(f"arm {arm} ({srcs[arm]}) stopped; run it alone to see why")
                    got.setdefault((name, arm), []).append(json.loads(line))
    finally:
        for p in procs.values():
            p.kill()
    print(f"{a.model} {a.dtype} {a.quant}, {a.prompts} prompts x {a.new_tokens} tokens, {a.rounds} rounds, "
          f"{a.threads} threads; old = {a.old}")
    for name in a.strategies.split(","):
        med = {arm: {k: statistics.median(x[k] or 0.0 for rnd in got[(name, arm)] for x in rnd)
                     for k in ("decode_tok_s", "ttft_s", "tau")} for arm in arms}
        same = all(x["ids"] == y["ids"] for arm in arms for x, y in zip(got[(name, arm)][0], got[(name, "old")][0]))
        for arm in arms:
            m = med[arm]
            print(f"  {name:7s} {arm:6s} decode {m['decode_tok_s']:7.1f} tok/s  TTFT {1000 * m['ttft_s']:7.1f} ms  "
                  f"tau {m['tau']:.2f}")
        aa = med["new-a"]["decode_tok_s"] / med["new-b"]["decode_tok_s"]
        new = statistics.mean([med["new-a"]["decode_tok_s"], med["new-b"]["decode_tok_s"]])
        print(f"  {name:7s} new/old decode {new / med['old']['decode_tok_s']:.3f}  (A/A new-a/new-b {aa:.3f}); "
              f"greedy tokens {'equal' if same else 'DIFFER'} across arms")


if __name__ == "__main__":
    main()

"""Decoding strategies of this tree against another git revision: same prompts, same outputs, speed ratio.

A refactor of the decoding layer should change nothing a user sees: every strategy's greedy tokens stay the
same and its speed stays within noise. Each round runs a worker process per tree (this one, the reference
revision's worktree, and this one again as an A/A twin), in a seeded random order; a worker loads the target
once and decodes every prompt with every strategy through `generate()`, recording tokens/s (prefill included)
and the token ids. The report: per strategy, the median over rounds of this tree's tok/s over the reference's
and over its twin's, and whether the tokens are identical across trees.

    python benchmarks/strategy_ab.py --ref 0ffd770 [--strategies ar,lookup,draft,eagle] [--target bf16]
                                     [--prompts 4] [--new-tokens 64] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import machine, now  # noqa: E402

TARGETS = {"fp32": ("none", "fp32"), "bf16": ("none", "bf16"), "w4a16": ("int4", "bf16")}
PARAMS = {
    "ar": {},
    "lookup": {},
    "draft": {"draft": {"model": "target", "quant": "int4", "dtype": "bf16"}},
    "eagle": {},
}

WORKER = r"""
import json, sys, time, torch
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
from specledger.bench.workload import load_workload
from specledger.decoding.factory import make_strategy
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.engine.loader import load_model
quant, dtype = args["target"]
lm = load_model("smollm2-135m", quant=quant, dtype=dtype)
qs = load_workload("builtin")[: args["prompts"]]
prompts = [lm.tokenizer.chat([{"role": "user", "content": q.turns[0]}]) for q in qs]
sp = SamplingParams(max_tokens=args["new_tokens"], temperature=0.0, ignore_eos=True)
out = {}
with torch.inference_mode():
    for name, params in args["strategies"].items():
        st = make_strategy(name, target=lm, **params)
        generate(st, prompts[0], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        toks, secs, ids = 0, 0.0, []
        for p in prompts:
            t0 = time.perf_counter()
            r = generate(st, p, sp)
            secs += time.perf_counter() - t0
            toks += len(r.token_ids)
            ids.append(r.token_ids)
        out[name] = {"tok_s": toks / secs, "ids": ids}
print("RESULT " + json.dumps(out))
"""


def run_worker(src: str, payload: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "OMP_WAIT_POLICY": "PASSIVE"}
    p = subprocess.run([sys.executable, "-c", WORKER, json.dumps(payload)], env=env, capture_output=True, text=True)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode or line is None:
        sys.exit(f"worker for {src} failed:\n{p.stderr[-2000:]}")
    return json.loads(line[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="git revision to compare with")
    ap.add_argument("--strategies", default="ar,lookup,draft,eagle")
    ap.add_argument("--target", default="bf16", choices=sorted(TARGETS))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    names = a.strategies.split(",")
    unknown = set(names) - set(PARAMS)
    if unknown:
        sys.exit(f"error: unknown strategies {sorted(unknown)} (choose from {', '.join(PARAMS)})")
    payload = {"target": TARGETS[a.target], "prompts": a.prompts, "new_tokens": a.new_tokens, "threads": a.threads,
               "strategies": {n: PARAMS[n] for n in names}}
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        wt = os.path.join(tmp, "ref")
        subprocess.run(["git", "worktree", "add", "--detach", wt, a.ref], check=True, capture_output=True)
        try:
            trees = {"this": here, "ref": os.path.join(wt, "src"), "this (A/A twin)": here}
            runs: dict[str, list[dict]] = {t: [] for t in trees}
            for r in range(a.rounds):
                order = list(trees)
                rng.shuffle(order)
                for t in order:
                    runs[t].append(run_worker(trees[t], payload))
                    print(f"round {r + 1}/{a.rounds} {t}: " + ", ".join(
                        f"{n} {runs[t][-1][n]['tok_s']:.1f}" for n in names), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", wt], capture_output=True)
    print(f"\n{machine()}  {now()}  target {a.target}, {a.prompts} prompts x {a.new_tokens} tokens, "
          f"{a.rounds} rounds, {a.threads} thread(s)")
    print(f"{'strategy':10} {'this tok/s':>11} {'ref tok/s':>10} {'this/ref':>9} {'this/twin':>10}  same tokens")
    summary = {}
    for n in names:
        med = {t: statistics.median(x[n]["tok_s"] for x in runs[t]) for t in trees}
        ratio = statistics.median(x[n]["tok_s"] / y[n]["tok_s"] for x, y in zip(runs["this"], runs["ref"]))
        twin = statistics.median(x[n]["tok_s"] / y[n]["tok_s"] for x, y in zip(runs["this"], runs["this (A/A twin)"]))
        same = all(x[n]["ids"] == runs["this"][0][n]["ids"] for t in trees for x in runs[t])
        summary[n] = {"this_tok_s": med["this"], "ref_tok_s": med["ref"], "ratio": ratio, "aa_ratio": twin,
                      "same_tokens": same}
        print(f"{n:10} {med['this']:11.1f} {med['ref']:10.1f} {ratio:9.3f} {twin:10.3f}  {same}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine(), "date": now(), "args": vars(a), "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()

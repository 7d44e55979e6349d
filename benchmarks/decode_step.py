"""Where one decode step's time goes: the whole step vs its matrix products alone, per precision;
optionally against the engine of another git revision, alternating run by run.

A decode step (one token on a cache of `--context` tokens, logits included) is timed as is; then
only the layers' and the LM head's Linear modules are run on the same weights with one-row inputs.
The difference is everything else: norms, RoPE, attention, casts and per-op overhead.

    python benchmarks/decode_step.py [--configs fp32,bf16,int8,int4] [--context 300] [--ref HEAD~3] [--threads 1]
    python benchmarks/decode_step.py --model qwen2.5-coder-1.5b --configs int4 --context 512,4096,16384 \
        --ref HEAD~1 --twin --threads 2 --rounds 3      # decode after a long prompt: attention's share

Several contexts are measured on one load. A cache longer than --prefill-max tokens is filled with random
keys and values instead of a prefill (a step's time does not depend on what the cache holds; a 16k prefill of
the 1.5B takes minutes). --twin runs this tree a second time in every round: an A/A pair beside the ref.

A quantized config may name the kernel it runs on: int4@torch / int8@torch (PyTorch's packed kernels, the
engine's own kernel disabled), int4@avx2 (the engine's kernel forced onto its AVX2 path), int4@vnni (AVX-512 VNNI
without AMX), int4@a8 (one int8
digit per activation, llama.cpp's precision); plain int4 / int8 take the engine's default.

With --ref, each measurement also runs in a subprocess importing `specledger` from a worktree of each
revision named (created under a temporary directory and removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

CONFIGS = {"fp32": ("none", "fp32"), "bf16": ("none", "bf16"), "int8": ("int8", "bf16"), "int4": ("int4", "bf16")}
KERNELS = {"": {}, "torch": {"SPECLEDGER_QKERNEL": "off"}, "avx2": {"SPECLEDGER_QKERNEL": "avx2"},
           "vnni": {"SPECLEDGER_QKERNEL": "vnni"}, "a8": {}}  # a8: load_model(activations=8)


def split_config(config: str) -> tuple[str, dict[str, str]]:
    """'int4@avx2' -> ('int4', the environment that selects that kernel)."""
    base, _, kernel = config.partition("@")
    if base not in CONFIGS or kernel not in KERNELS or (kernel and base not in ("int4", "int8")):
        sys.exit(f"unknown config {config!r}; choose from {', '.join(CONFIGS)}, optionally int4/int8@"
                 f"{'|'.join(k for k in KERNELS if k)}")
    return base, KERNELS[kernel]


def _median_ms(fn, reps: int, inner: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        ts.append((time.perf_counter() - t0) / inner * 1000)
    return sorted(ts)[len(ts) // 2]


def measure(model: str, config: str, contexts: list[int], prefill_max: int, reps: int = 5) -> dict[int, dict]:
    """Per context: median ms of a whole decode step and of its Linear products alone (this process's specledger)."""
    from specledger.engine.loader import load_model

    quant, dtype = CONFIGS[split_config(config)[0]]
    m = load_model(model, quant=quant, dtype=dtype, activations=8 if config.endswith("@a8") else 16).model
    linears = [mod for blk in m.layers for mod in (blk.attention.wqkv, blk.attention.wo, blk.feed_forward.w13,
                                                   blk.feed_forward.w2)] + [m.output]
    xs = [torch.randn(1, 1, mod.in_features, dtype=m.dtype) for mod in linears]
    tok = torch.tensor([[1]])

    def products() -> None:
        for mod, x in zip(linears, xs):
            mod(x)

    out = {}
    with torch.inference_mode():
        linears_ms = _median_ms(products, reps, 20)
        for context in contexts:
            cache = m.new_cache(context + 8)
            if context <= prefill_max:
                m.hidden(torch.randint(0, 1000, (1, context)), cache)
            else:  # random entries of a typical size in place of a prefill
                cache.reserve(context + 8)
                cache.k.normal_(0, 2)
                cache.v.normal_(0, 0.5)
                cache.lengths[0] = context

            def step(cache=cache, context=context) -> None:
                cache.rollback(0, context)
                m.logits(m.hidden(tok, cache))

            out[context] = {"step_ms": _median_ms(step, reps, max(2, min(20, 20_000 // context))),
                            "linears_ms": linears_ms}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a registry name or a model path")
    ap.add_argument("--configs", default="fp32,bf16,int8,int4")
    ap.add_argument("--context", default="300", help="cached tokens before the step; several: 512,4096,16384")
    ap.add_argument("--prefill-max", type=int, default=2048,
                    help="longer caches are filled with random entries instead of a prefill")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ref", default=None, help="git revisions whose engines run alongside (comma-separated)")
    ap.add_argument("--twin", action="store_true", help="run this tree twice in every round (an A/A pair)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    configs = a.configs.split(",")
    for c in configs:
        split_config(c)
    try:
        contexts = [int(x) for x in a.context.split(",")]
    except ValueError:
        sys.exit(f"--context {a.context!r}: expected token counts such as 300 or 512,4096")
    if not contexts or min(contexts) < 1:
        sys.exit(f"--context {a.context!r}: every count must be at least 1")
    if a.child:  # one measurement, as JSON, for the parent
        print(json.dumps(measure(a.model, configs[0], contexts, a.prefill_max)))
        return

    def run(config: str, src: str) -> dict[int, dict]:
        env = dict(os.environ, PYTHONPATH=src, **split_config(config)[1])
        cmd = [sys.executable, __file__, "--child", "--model", a.model, "--configs", config, "--context", a.context,
               "--prefill-max", str(a.prefill_max), "--threads", str(a.threads)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{config} under {src} failed:\n{res.stderr.strip()[-2000:]}")
        return {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": here} | ({"this tree (A/A)": here} if a.twin else {})
        worktrees = []
        for i, ref in enumerate(a.ref.split(",") if a.ref else []):
            wt = os.path.join(tmp, f"ref{i}")
            subprocess.run(["git", "worktree", "add", "--detach", wt, ref], check=True, capture_output=True)
            worktrees.append(wt)
            trees[f"ref {ref}"] = os.path.join(wt, "src")
        try:
            res = {(c, t): [] for c in configs for t in trees}
            for _ in range(a.rounds):
                for c in configs:
                    for t, src in trees.items():
                        res[(c, t)].append(run(c, src))
        finally:
            for wt in worktrees:
                subprocess.run(["git", "worktree", "remove", "--force", wt], capture_output=True)
    print(f"decode step on a cache of {a.context} tokens, {a.model}, {a.threads} thread(s); best of {a.rounds} rounds, "
          f"trees alternating")
    print(f"{'config':10} {'context':>8} {'tree':24} {'step ms':>8} {'linears ms':>11} {'rest ms':>8} {'tok/s':>7} "
          f"{'/ first':>8}")
    for c in configs:
        for n in contexts:
            first = None
            for t in trees:
                r = min((x[n] for x in res[(c, t)]), key=lambda x: x["step_ms"])
                first = first or r["step_ms"]
                print(f"{c:10} {n:8} {t:24} {r['step_ms']:8.1f} {r['linears_ms']:11.1f} "
                      f"{r['step_ms'] - r['linears_ms']:8.1f} {1000 / r['step_ms']:7.1f} {r['step_ms'] / first:8.3f}")


if __name__ == "__main__":
    main()

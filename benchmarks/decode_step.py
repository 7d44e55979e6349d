"""Where one decode step's time goes: the whole step vs its matrix products alone, per precision;
optionally against the engine of another git revision, alternating run by run.

A decode step (one token on a cache of `--context` tokens, logits included) is timed as is; then
only the layers' and the LM head's Linear modules are run on the same weights with one-row inputs.
The difference is everything else: norms, RoPE, attention, casts and per-op overhead.

    python benchmarks/decode_step.py [--configs fp32,bf16,int8,int4] [--context 300] [--ref HEAD~3] [--threads 1]

A quantized config may name the kernel it runs on: int4@torch / int8@torch (PyTorch's packed kernels, the
engine's own kernel disabled), int4@avx2 (the engine's kernel forced onto its AVX2 path), int4@vnni (AVX-512 VNNI
without AMX), int4@a8 (one int8
digit per activation, llama.cpp's precision); plain int4 / int8 take the engine's default.

With --ref, each measurement also runs in a subprocess importing `specledger` from a worktree of
that revision (created under a temporary directory and removed afterwards).
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


def measure(config: str, context: int, reps: int = 5, inner: int = 20) -> dict:
    """Median ms of a whole decode step and of its Linear products alone (this process's specledger)."""
    from specledger.engine.loader import load_model

    quant, dtype = CONFIGS[split_config(config)[0]]
    m = load_model("smollm2-135m", quant=quant, dtype=dtype, activations=8 if config.endswith("@a8") else 16).model
    cache = m.new_cache(context + 8)
    linears = [mod for blk in m.layers for mod in (blk.attention.wqkv, blk.attention.wo, blk.feed_forward.w13,
                                                   blk.feed_forward.w2)] + [m.output]
    xs = [torch.randn(1, 1, mod.in_features, dtype=m.dtype) for mod in linears]
    tok = torch.tensor([[1]])

    def step() -> None:
        cache.rollback(0, context)
        m.logits(m.hidden(tok, cache))

    def products() -> None:
        for mod, x in zip(linears, xs):
            mod(x)

    out = {}
    with torch.inference_mode():
        m.hidden(torch.randint(0, 1000, (1, context)), cache)
        for name, fn in (("step_ms", step), ("linears_ms", products)):
            for _ in range(3):
                fn()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                ts.append((time.perf_counter() - t0) / inner * 1000)
            out[name] = sorted(ts)[len(ts) // 2]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="fp32,bf16,int8,int4")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ref", default=None, help="git revision whose engine runs alongside")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    configs = a.configs.split(",")
    for c in configs:
        split_config(c)
    if a.child:  # one measurement, as JSON, for the parent
        print(json.dumps(measure(configs[0], a.context)))
        return

    def run(config: str, src: str) -> dict:
        env = dict(os.environ, PYTHONPATH=src, **split_config(config)[1])
        cmd = [sys.executable, __file__, "--child", "--configs", config, "--context", str(a.context),
               "--threads", str(a.threads)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": here}
        if a.ref:
            wt = os.path.join(tmp, "ref")
            subprocess.run(["git", "worktree", "add", "--detach", wt, a.ref], check=True, capture_output=True)
            trees[f"ref {a.ref}"] = os.path.join(wt, "src")
        try:
            res = {(c, t): [] for c in configs for t in trees}
            for _ in range(a.rounds):
                for c in configs:
                    for t, src in trees.items():
                        res[(c, t)].append(run(c, src))
        finally:
            if a.ref:
                subprocess.run(["git", "worktree", "remove", "--force", wt], capture_output=True)
    print(f"decode step on a {a.context}-token cache, smollm2-135m, {a.threads} thread(s); best of {a.rounds} rounds")
    print(f"{'config':10} {'tree':24} {'step ms':>8} {'linears ms':>11} {'rest ms':>8} {'tok/s bound':>12}")
    for c in configs:
        for t in trees:
            r = min(res[(c, t)], key=lambda x: x["step_ms"])
            print(f"{c:10} {t:24} {r['step_ms']:8.1f} {r['linears_ms']:11.1f} {r['step_ms'] - r['linears_ms']:8.1f} "
                  f"{1000 / r['step_ms']:12.1f}")


if __name__ == "__main__":
    main()

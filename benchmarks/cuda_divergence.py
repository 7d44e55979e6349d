"""How far the embedded model's greedy answers on CUDA follow the CPU's, per precision, and the strategies on CUDA
against CUDA's own autoregressive answers (lossless up to rounding: bf16 batches of different shapes round
differently, so a speculative answer can part from the plain one at a near-tie).

    python benchmarks/cuda_divergence.py [--prompts 6] [--new-tokens 64]

Prints, per CUDA configuration, the first position where each answer parts from the reference (none: identical).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from common import long_prompts, machine, now  # noqa: E402

from specledger.decoding.factory import make_strategy  # noqa: E402
from specledger.decoding.loop.generate import generate  # noqa: E402
from specledger.decoding.sampling import SamplingParams  # noqa: E402
from specledger.engine.loader import load_model  # noqa: E402
from specledger.quality.gates import first_divergence  # noqa: E402

console = Console(width=160)
STRATEGIES = {"lookup": {}, "draft": {"draft": {"model": "target", "quant": "int4", "dtype": "bf16"}}, "eagle": {}}


def answers(strategy, prompts: list[list[int]], sp: SamplingParams) -> list[list[int]]:
    return [generate(strategy, p, sp).token_ids for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda", help="the device under test (cpu: a check of this script)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device")
    console.print(f"{now()}  {machine()}")
    sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
    cpu = load_model("smollm2-135m", dtype="fp32")
    prompts = [cpu.tokenizer.chat([{"role": "user", "content": p}]) for p in long_prompts(a.prompts)]
    ref = answers(make_strategy("ar", target=cpu), prompts, sp)
    t = Table(title=f"First divergence (token index of {a.new_tokens}; '-' identical) on {a.device}")
    t.add_column("configuration")
    t.add_column("reference")
    for i in range(len(prompts)):
        t.add_column(f"p{i}", justify="right")
    t.add_column("identical", justify="right")

    def row(name: str, ref_name: str, got: list[list[int]], want: list[list[int]]) -> None:
        d = [first_divergence(g, w) for g, w in zip(got, want)]
        t.add_row(name, ref_name, *["-" if x is None else str(x) for x in d], f"{sum(x is None for x in d)}/{len(d)}")

    for quant, dtype in (("none", "fp32"), ("none", "bf16"), ("int4", "bf16"), ("int8", "bf16")):
        lm = load_model("smollm2-135m", quant=quant, dtype=dtype, device=a.device)
        ar = answers(make_strategy("ar", target=lm), prompts, sp)
        row(f"{lm.label} ar", "CPU fp32 ar", ar, ref)
        for name, params in STRATEGIES.items():
            if name == "draft" and quant == "int4":
                continue  # the W4A16 copy of a W4A16 target is the target itself
            row(f"{lm.label} {name}", f"{a.device} ar, same precision", answers(make_strategy(name, lm, **params), prompts, sp), ar)
        del lm
        if a.device == "cuda":
            torch.cuda.empty_cache()
    console.print(t)


if __name__ == "__main__":
    main()

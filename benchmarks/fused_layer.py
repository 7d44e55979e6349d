"""Does the fused whole-layer call (csrc/fused.cpp: decode_layer, one call per layer for one new token) still pay
over the op-by-op layer (the same fused norm, SwiGLU, RoPE and attention ops, one call each) now that the layer is
written once (issue 44 item 5)? Autoregressive decoding at concurrency 1 through generate(), the two tables of ops
on the same loaded model, alternating round by round, with an A/A twin of the fused arm.

    python benchmarks/fused_layer.py [--model smollm2-135m] [--precisions int4,int8] [--rounds 6] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import machine, median, now  # noqa: E402

from specledger.decoding.factory import make_strategy  # noqa: E402
from specledger.decoding.loop.generate import generate  # noqa: E402
from specledger.decoding.sampling import SamplingParams  # noqa: E402
from specledger.engine.cpu_ops import declines  # noqa: E402
from specledger.engine.loader import load_model  # noqa: E402

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain why the sky is blue in three sentences.",
           "List five uses of a binary search tree."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--precisions", default="int4,int8",
                    help="comma-separated: int4, int8 (the fused layer serves only the kernel's quantized products)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=64)
    a = ap.parse_args()
    sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
    print(f"{now()}  {machine()}  model {a.model}")
    for prec in a.precisions.split(","):
        quant = {"int8": "int8", "int4": "int4"}.get(prec, "none")
        lm = load_model(a.model, dtype="fp32" if prec == "fp32" else "bf16", quant=quant)
        assert lm.tokenizer is not None
        fused = lm.model.ops
        arms = {"fused": fused, "op-by-op": dataclasses.replace(fused, decode_layer=declines), "fused-twin": fused}
        strategy = make_strategy("ar", lm)
        prompts = [lm.tokenizer.encode(p) for p in PROMPTS]
        tps: dict[str, list[float]] = {k: [] for k in arms}
        same = True
        for ops in arms.values():  # warm-up
            lm.model.use_ops(ops)
            generate(strategy, prompts[0], SamplingParams(max_tokens=4))
        names = list(arms)
        for r in range(a.rounds):
            ref = None
            for name in names[r % 3:] + names[:r % 3]:  # the order rotates: the first arm of a round runs slower
                ops = arms[name]
                lm.model.use_ops(ops)
                t, toks, outs = 0.0, 0, []
                for ids in prompts:
                    r = generate(strategy, ids, sp)
                    t += r.total_s - r.ttft_s
                    toks += len(r.token_ids) - 1
                    outs.append(r.token_ids)
                tps[name].append(toks / t)
                ref = ref or outs
                same &= outs == ref
        m = {k: median(v) for k, v in tps.items()}
        print(f"{prec}: decode tok/s fused {m['fused']:.1f}, op-by-op {m['op-by-op']:.1f}, twin {m['fused-twin']:.1f}"
              f" | op-by-op/fused {m['op-by-op'] / m['fused']:.3f}, A/A twin/fused {m['fused-twin'] / m['fused']:.3f}"
              f" | same tokens: {same}")


if __name__ == "__main__":
    main()

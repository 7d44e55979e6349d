"""Does `torch.compile` of the decode step pay on this machine? Eager vs compiled, alternating.

The step (embedding → layers → LM head for one token; the KV-cache position passed as an int
argument, so dynamic shapes cover every length) is compiled with inductor; the script prints the
compile time, eager and compiled tok/s, whether both give the same greedy tokens, and the ops
that dominate the compiled step.

    python benchmarks/compile_probe.py [--config int4] [--tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from typing import cast

import torch

CONFIGS = {"fp32": ("none", "fp32"), "bf16": ("none", "bf16"), "int8": ("int8", "bf16"), "int4": ("int4", "bf16")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="int4", choices=list(CONFIGS))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specledger.engine.loader import load_model
    from specledger.engine.model import Block, ragged_block
    from specledger.engine.ragged import Segment, plan_pass, rope_at

    quant, dtype = CONFIGS[a.config]
    m = load_model("smollm2-135m", quant=quant, dtype=dtype).model
    cache = m.new_cache(1024)

    def core(tok: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int) -> torch.Tensor:
        plan = plan_pass([Segment(0, 1)], cache, tok.device)
        x = m.tok_embeddings(tok).float()
        for i, layer in enumerate(m.layers):
            x = ragged_block(cast(Block, layer), i, x, cos, sin, plan, cache)
        return m.logits(m.norm(x))

    def decode(fn, n: int) -> tuple[float, list[int]]:
        with torch.inference_mode():
            cache.rollback(0, 0)
            m.hidden(torch.arange(200)[None] % 1000, cache)
            tok, out = torch.tensor([[1]]), []
            t0 = time.perf_counter()
            for _ in range(n):
                start = cache.lengths[0]
                cos, sin = rope_at(m.rope_cos, m.rope_sin, slice(start, start + 1), m.dtype)
                logits = fn(tok, cos, sin, start)
                cache.lengths[0] = start + 1
                tok = logits[:, -1].argmax(-1).view(1, 1)
                out.append(int(tok))
            return n / (time.perf_counter() - t0), out

    decode(core, 4)
    t0 = time.perf_counter()
    compiled = torch.compile(core, dynamic=True)
    decode(compiled, 4)
    compile_s = time.perf_counter() - t0
    rates: dict[str, list[float]] = {"eager": [], "compiled": []}
    outs = {}
    for _ in range(2):
        for name, fn in (("eager", core), ("compiled", compiled)):
            r, outs[name] = decode(fn, a.tokens)
            rates[name].append(r)
    e, c = max(rates["eager"]), max(rates["compiled"])
    print(f"{a.config}, {a.tokens} tokens, {torch.get_num_threads()} thread(s): compile + first tokens {compile_s:.0f} s; "
          f"eager {e:.1f} tok/s, compiled {c:.1f} tok/s ({c / e:.2f}x); same tokens: {outs['eager'] == outs['compiled']}")
    from torch.profiler import profile

    with profile() as p:
        decode(compiled, 8)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=6))


if __name__ == "__main__":
    main()

"""Why the W4A16 model keeps an int8 LM head: quality and step time with an int4 (g32) head instead.

Loads the fp32 reference and two W4A16 g32 copies of the embedded model, one with the usual int8
output layer (the GGUF's Q8_0 tied embedding) and one with the output layer re-quantized to int4 g32;
prints teacher-forced top-1 agreement and mean KL against fp32 on the built-in quality text, and the
decode step time of both (one token on a 300-token cache, alternating, median of rounds).

    python benchmarks/lm_head_int4.py [--threads 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import torch

from specledger.engine.loader import load_model
from specledger.engine.quant import Int4Linear, int4_grid
from specledger.data import quality_text
from specledger.quality.agreement import teacher_forced_agreement


def step_ms(model, context: int = 300, steps: int = 50) -> float:
    cache = model.new_cache(context + 8)
    model.hidden(torch.randint(0, 1000, (1, context)), cache)
    tok = torch.tensor([[1]])
    t0 = time.perf_counter()
    for _ in range(steps):
        cache.rollback(0, context)
        model.logits(model.hidden(tok, cache))
    return (time.perf_counter() - t0) / steps * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ref = load_model("smollm2-135m", quant="none", dtype="fp32")
    heads = {"int8 head": load_model("smollm2-135m", quant="int4"), "int4 g32 head": load_model("smollm2-135m", quant="int4")}
    heads["int4 g32 head"].model.output = Int4Linear(
        int4_grid(ref.model.output.weight.data, 32), heads["int4 g32 head"].model.dtype, ref.model.device
    )
    ids = ref.tokenizer.encode(quality_text())
    times: dict[str, list[float]] = {k: [] for k in heads}
    with torch.inference_mode():
        for name, lm in heads.items():
            q = teacher_forced_agreement(ref, lm, ids)
            print(f"{name}: top-1 agreement {q.top1_agreement:.3f}, mean KL {q.mean_kl:.4f}, "
                  f"perplexity {q.ppl_candidate:.2f} (fp32 {q.ppl_reference:.2f})")
        for _ in range(a.rounds):
            for name, lm in heads.items():
                times[name].append(step_ms(lm.model))
    for name, ts in times.items():
        print(f"{name}: decode step {sorted(ts)[len(ts) // 2]:.2f} ms (median of {a.rounds})")


if __name__ == "__main__":
    main()

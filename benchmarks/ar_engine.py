"""Autoregressive decoding, side by side: Hugging Face transformers, the engine in fp32 / bf16 /
W8A16 / W4A16, and llama.cpp (if llama-cpp-python is installed), same prompts, same threads,
alternating run by run. Then the verification-cost curve: forward time for n new tokens on top
of a 256- and a 1024-token cache, for each engine precision.

    python benchmarks/ar_engine.py [--rounds 2] [--new-tokens 128] [--no-hf] [--no-llamacpp] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from common import LlamaCpp, long_prompts, machine, median, now, rss  # noqa: E402

from specledger.decoding.factory import make_strategy  # noqa: E402
from specledger.decoding.loop.generate import generate  # noqa: E402
from specledger.decoding.sampling import SamplingParams  # noqa: E402
from specledger.engine.loader import load_model  # noqa: E402
from specledger.engine.registry import resolve_model  # noqa: E402

console = Console(width=160)


class Engine:
    def __init__(self, name: str, quant: str, dtype: str):
        r0 = rss()
        self.lm = load_model("smollm2-135m", quant=quant, dtype=dtype)
        self.name, self.load_rss = name, rss() - r0
        self.weight_bytes = self.lm.weight_bytes
        self.strategy = make_strategy("ar", self.lm)

    def run(self, ids: list[int], n: int) -> dict:
        r = generate(self.strategy, ids, SamplingParams(max_tokens=n, ignore_eos=True))
        return {"ttft": r.ttft_s, "total": r.total_s, "tokens": len(r.token_ids), "ids": r.token_ids}


class HF:
    def __init__(self):
        from transformers import AutoModelForCausalLM

        p = resolve_model("smollm2-135m")
        r0 = rss()
        self.m = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32).eval()
        self.name, self.load_rss = "transformers fp32", rss() - r0
        self.weight_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in self.m.parameters()}.values())

    def run(self, ids: list[int], n: int) -> dict:
        from transformers import TextStreamer  # noqa: F401  (first-token timing via a streamer)

        first: list[float] = []

        class Mark:
            def put(self, _v):
                first.append(time.perf_counter())

            def end(self):
                pass

        x = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.m.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=Mark())
        t1 = time.perf_counter()
        # the streamer sees the prompt first, then each new token
        return {"ttft": first[1] - t0, "total": t1 - t0, "tokens": out.shape[1] - len(ids), "ids": out[0, len(ids):].tolist()}


def verify_curve(lm, contexts=(256, 1024)) -> dict:
    from specledger.engine.timing import forward_time_curve

    return {(ctx, n): 1000 * t for ctx in contexts for n, t in forward_time_curve(lm, context=ctx).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--no-curve", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="threads for every contender (default: torch's)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    console.print(f"[bold]ar_engine[/] {now()} — {machine()}")
    contenders = []
    if not a.no_hf:
        contenders.append(HF())
    for name, q, d in [("engine fp32", "none", "fp32"), ("engine bf16", "none", "bf16"), ("engine W8A16", "int8", "bf16"), ("engine W4A16 g32", "int4", "bf16")]:
        contenders.append(Engine(name, q, d))
    if not a.no_llamacpp:
        try:
            contenders.append(LlamaCpp())
        except ImportError:
            console.print("llama-cpp-python is not installed: llama.cpp skipped (pip install 'specledger[llamacpp]')")
    tok = next(c for c in contenders if isinstance(c, Engine)).lm.tokenizer
    prompts = [tok.chat([{"role": "user", "content": p}]) for p in long_prompts(a.prompts)]
    console.print(f"prompts: {len(prompts)}, tokens {[len(p) for p in prompts]}, {a.new_tokens} new tokens, greedy, {a.rounds} rounds")
    for c in contenders:  # warm-up
        c.run(prompts[0][:32], 4)
    res: dict[str, list[dict]] = {c.name: [] for c in contenders}
    for r in range(a.rounds):
        for i, ids in enumerate(prompts):
            order = contenders[(i + r) % len(contenders):] + contenders[: (i + r) % len(contenders)]
            for c in order:
                res[c.name].append({**c.run(ids, a.new_tokens), "prompt": i})
    base = "transformers fp32" if "transformers fp32" in res else "engine fp32"
    summary = {}
    for c in contenders:
        rs = res[c.name]
        dec = [(x["tokens"] - 1) / (x["total"] - x["ttft"]) for x in rs]
        e2e = [x["tokens"] / x["total"] for x in rs]
        summary[c.name] = {"decode_tok_s": median(dec), "e2e_tok_s": median(e2e), "ttft_ms": median([x["ttft"] * 1000 for x in rs]),
                           "ttft_p90_ms": sorted(x["ttft"] * 1000 for x in rs)[int(0.9 * (len(rs) - 1))],
                           "weight_bytes": c.weight_bytes, "load_rss_bytes": c.load_rss}
    t = Table(title=f"autoregressive decode, {a.new_tokens} new tokens (medians over {a.rounds * len(prompts)} runs)")
    for col in ("contender", "decode tok/s", "e2e tok/s", "TTFT ms", "TTFT p90 ms", f"decode vs {base}", "vs llama.cpp", "weight MB", "RSS at load MB"):
        t.add_column(col, justify="right")
    llama = summary.get("llama.cpp Q4_1")
    for name, s in summary.items():
        t.add_row(name, f"{s['decode_tok_s']:.1f}", f"{s['e2e_tok_s']:.1f}", f"{s['ttft_ms']:.0f}", f"{s['ttft_p90_ms']:.0f}",
                  f"{s['decode_tok_s'] / summary[base]['decode_tok_s']:.2f}x",
                  f"{s['decode_tok_s'] / llama['decode_tok_s']:.2f}x" if llama else "-",
                  f"{s['weight_bytes'] / 1e6:.0f}", f"{s['load_rss_bytes'] / 1e6:.0f}")
    console.print(t)
    ref = res["engine fp32"]
    for name in res:
        if name.startswith("engine") or name.startswith("transformers"):
            same = sum(x["ids"] == y["ids"] for x, y in zip(res[name], ref))
            console.print(f"{name}: greedy output identical to engine fp32 on {same}/{len(ref)} runs")
    curves = {}
    if not a.no_curve:
        t = Table(title="verification cost: forward ms for n new tokens on a cache of 256 | 1024 tokens (ratio to n=1)")
        t.add_column("config")
        ns = (1, 2, 4, 8, 16, 32, 64)
        for n in ns:
            t.add_column(f"n={n}", justify="right")
        for c in contenders:
            if isinstance(c, Engine):
                cv = verify_curve(c.lm)
                curves[c.name] = {f"{k[0]}:{k[1]}": v for k, v in cv.items()}
                for ctx in (256, 1024):
                    t.add_row(f"{c.name} @{ctx}", *[f"{cv[(ctx, n)]:.1f} ({cv[(ctx, n)] / cv[(ctx, 1)]:.1f}x)" for n in ns])
        console.print(t)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": now(), "machine": machine(), "summary": summary, "curves": curves}, f, indent=2)


if __name__ == "__main__":
    main()

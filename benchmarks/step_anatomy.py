"""Where one decode step's time goes on a device: wall time, the accelerator's busy time, kernel launches and
host syncs per step, and the host ops that cost most. A random-weight model of the embedded model's shape
(SmolLM2-135M) stands in for it, so this needs no weights (the step's cost does not depend on their values).

    python benchmarks/step_anatomy.py [--device cuda] [--precisions bf16,int4] [--steps 32]

A step whose wall time is far above its busy time is bound by the host (Python, launches, syncs), not the chip.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # the repository root: tests.conftest
from common import machine, now  # noqa: E402
from tests.conftest import tiny_tensors  # noqa: E402

from specledger.engine.config import ModelConfig  # noqa: E402
from specledger.engine.loader import build_model  # noqa: E402

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9,
                      n_kv_heads=3, head_dim=64, max_seq_len=2048, rope_theta=100000.0, rms_eps=1e-5,
                      tie_embeddings=True, eos_ids=[])
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "aten::_local_scalar_dense", "aten::item")


def decode(model, cache, tok: torch.Tensor, steps: int, device: str) -> torch.Tensor:
    for _ in range(steps):
        logits = model(tok, cache)
        tok = logits[:, -1:].argmax(-1)
    if device == "cuda":
        torch.cuda.synchronize()
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precisions", default="bf16,int4", help="comma list of fp32, bf16, int4, int8")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    print(f"{now()}  {machine()}")
    tensors = tiny_tensors(SMOLLM2, 0, 0.3)
    for prec in a.precisions.split(","):
        dtype, quant = ("bf16", prec) if prec in ("int4", "int8") else (prec, "none")
        model = build_model(SMOLLM2, tensors, dtype=dtype, quant=quant, device=a.device)
        prompt = torch.randint(0, SMOLLM2.vocab_size, (1, 64), device=a.device)
        cache = model.new_cache(64 + 4 * a.steps + 8)
        tok = model(prompt, cache)[:, -1:].argmax(-1)
        decode(model, cache, tok, 4, a.device)  # warm-up
        t0 = time.perf_counter()
        decode(model, cache, tok, a.steps, a.device)
        wall = (time.perf_counter() - t0) / a.steps
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
        with profile(activities=acts) as prof:
            decode(model, cache, tok, a.steps, a.device)
        ev = prof.key_averages()
        on_chip = [e for e in prof.events() if e.device_type != DeviceType.CPU]  # kernels and copies, not host ops
        busy = sum(e.self_device_time_total for e in on_chip) / a.steps / 1e3 if on_chip else float("nan")
        kernels = len(on_chip) / a.steps
        syncs = {k: sum(e.count for e in ev if e.key.startswith(k)) / a.steps for k in SYNCS}
        print(f"\n== {prec} on {a.device}: {wall * 1e3:.2f} ms/step wall, {busy:.2f} ms/step busy on the device, "
              f"{kernels:.0f} kernels and copies/step; per step: " + ", ".join(f"{k} {v:.1f}" for k, v in syncs.items() if v))
        print(ev.table(sort_by="self_cpu_time_total", row_limit=a.top, max_name_column_width=60))
        del model, cache


if __name__ == "__main__":
    main()

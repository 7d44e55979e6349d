"""This host's roofline: memory read bandwidth and matrix-product peaks at 1..N threads, and what they allow a model.

Measured, each at every thread count from 1 to --threads (best of --reps, after a warm-up):
  read GB/s        torch.sum over a --mib MiB fp32 tensor (bigger than any cache): the bandwidth a decode step can
                   at best read its weights at
  W4 / W8 1-row    the engine's kernel on one row of a 17920x1536 matrix (the 1.5B's fused gate/up), cycling
                   through --mib MiB of distinct copies of it (one alone, 17 MB at W4, sits in this EPYC's 32 MiB
                   L3 and read at 70.8 GB/s, a cache rate): the weight bytes (engine/roofline.py's count) over the
                   time, i.e. the read rate from memory the kernel reaches itself. The decode limit takes the
                   faster of this and the sum's rate: the fastest read this host was seen to do
  int8 GMAC/s      the engine's kernel at int8 activations (W8A8, one digit) on --rows rows of that matrix: the peak
                   a W4A8 / W8A8 prefill is a share of (W4A16 / W8A16 run two digits: half of it at most)
  bf16 / fp32      F.linear on the same shape (oneDNN's packed bf16 where the host can pack it)
Then, for --model at each precision: the bytes one decode token reads (engine/roofline.py's docstring says what is
counted) at --context cached positions and the tokens per second that allows at each measured bandwidth; the MACs
of a --prefill-tokens prefill and the seconds that takes at the precision's measured peak. A decode figure's share
of its limit is its tok/s over the limit's; a prefill's, the limit's seconds over its own.

    python benchmarks/roofline.py [--threads 2] [--model smollm2-135m] [--context 300] [--prefill-tokens 4096]
                                  [--json benchmarks/results/roofline.json]

No A/A pair: every figure is a best-of, a ceiling; on a busy host (others' processes on the cores) they read low.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from common import machine, now
from specledger.engine import qkernel
from specledger.engine.loader import read_model_config
from specledger.engine.packed_linear import pack
from specledger.engine.model import Linear
from specledger.engine.quant import Int4Linear, Int8Linear, int4_grid, use_activation_bits
from specledger.engine.roofline import (Precision, compute_kind, decode_bytes, matrix_bytes, model_bytes,
                                        prefill_limit_s, prefill_macs)
from specledger.errors import SpecLedgerError

OUT, IN = 17920, 1536  # Qwen2.5 1.5B's fused gate/up projection
PRECISIONS = [Precision("fp32"), Precision("bf16"), Precision("bf16", "int8"), Precision("bf16", "int8", 32, 8),
              Precision("bf16", "int4"), Precision("bf16", "int4", 32, 8)]


def best_s(fn: Callable[[], object], reps: int, min_s: float = 0.2) -> float:
    """The fastest of `reps` timings, each repeating fn for at least min_s (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_s:
                break
        best = min(best, dt / n)
    return best


def measure(threads: int, mib: int, rows: int, reps: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    big = torch.ones(mib * 2**20 // 4)
    out: dict[str, float] = {"read_gbs": big.numel() * 4 / best_s(big.sum, reps) / 1e9}
    del big
    torch.manual_seed(0)
    w = torch.randn(OUT, IN) * 0.02
    one, many = torch.randn(1, IN).bfloat16(), torch.randn(rows, IN).bfloat16()
    macs = OUT * IN * rows
    with torch.inference_mode():
        if qkernel.op() is not None:
            dev = torch.device("cpu")
            q4 = Int4Linear(int4_grid(w, 32), torch.bfloat16, dev)
            q8 = Int8Linear(w, torch.bfloat16, dev)
            for name, q, p in (("w4_1row_gbs", q4, Precision("bf16", "int4")), ("w8_1row_gbs", q8,
                                                                              Precision("bf16", "int8"))):
                copies = [q] + [copy.deepcopy(q) for _ in range(max(0, -(-mib * 2**20 // matrix_bytes(OUT, IN, p)) - 1))]
                out[name] = len(copies) * matrix_bytes(OUT, IN, p) / best_s(
                    lambda cs=copies: [c(one) for c in cs], reps) / 1e9
                del copies
            use_activation_bits(q8, 8)
            out["int8_gmacs"] = macs / best_s(lambda: q8(many), reps) / 1e9
            use_activation_bits(q8, 16)
            out["int8_a16_gmacs"] = macs / best_s(lambda: q8(many), reps) / 1e9
        lin = Linear(IN, OUT, bias=False)
        lin.weight.data = w.bfloat16()
        packed = pack(lin) or (lambda x: F.linear(x, lin.weight))
        out["bf16_gmacs"] = macs / best_s(lambda: packed(many), reps) / 1e9
        out["fp32_gmacs"] = macs / best_s(lambda: F.linear(many.float(), w), reps) / 1e9
    return out


def host_table(res: dict[int, dict[str, float]]) -> Table:
    t = Table(title=f"host peaks, best of the reps ({qkernel.describe()})")
    t.add_column("threads", justify="right")
    names = {"read_gbs": "read GB/s", "w4_1row_gbs": "W4 1-row GB/s", "w8_1row_gbs": "W8 1-row GB/s",
             "int8_gmacs": f"int8 GMAC/s ({ROWS[0]} rows)", "int8_a16_gmacs": "int8 2-digit GMAC/s",
             "bf16_gmacs": "bf16 GMAC/s", "fp32_gmacs": "fp32 GMAC/s"}
    keys = [k for k in names if any(k in r for r in res.values())]
    for k in keys:
        t.add_column(names[k], justify="right")
    for n, r in res.items():
        t.add_row(str(n), *[f"{r[k]:.1f}" if k in r else "–" for k in keys])
    return t


ROWS = [128]


def read_limit_gbs(r: dict[str, float]) -> float:
    """The decode roofline's bandwidth: the fastest read from memory measured at this thread count."""
    return max(r["read_gbs"], r.get("w4_1row_gbs", 0.0), r.get("w8_1row_gbs", 0.0))


def model_table(model: str, res: dict[int, dict[str, float]], context: int, prefill: int) -> tuple[Table, list[dict]]:
    cfg = read_model_config(model)
    threads = list(res)
    t = Table(title=f"{model}: decode at c=1 after {context} cached positions; prefill of {prefill} tokens")
    for col in ("precision", "resident MB", "decode MB/token", *[f"decode limit tok/s, {n}t" for n in threads],
                "prefill GMAC", *[f"prefill limit s, {n}t" for n in threads]):
        t.add_column(col, justify="left" if col == "precision" else "right")
    rows = []
    for p in PRECISIONS:
        if p.quant != "none" and qkernel.op() is None:
            continue
        per_token = decode_bytes(cfg, p, context)
        peaks = {n: {"int8": r.get("int8_gmacs", 0.0), "bf16": r["bf16_gmacs"], "fp32": r["fp32_gmacs"]}
                 for n, r in res.items()}
        decode = {n: read_limit_gbs(r) * 1e9 / per_token for n, r in res.items()}
        pre = {n: prefill_limit_s(cfg, p, prefill, peaks[n]) for n in threads if peaks[n][compute_kind(p)[0]] > 0}
        rows.append({"precision": p.label, "resident_bytes": model_bytes(cfg, p).resident,
                     "decode_bytes_per_token": per_token, "decode_limit_tps": decode,
                     "prefill_macs": prefill_macs(cfg, prefill), "prefill_limit_s": pre})
        t.add_row(p.label, f"{model_bytes(cfg, p).resident / 1e6:.0f}", f"{per_token / 1e6:.1f}",
                  *[f"{decode[n]:.1f}" for n in threads], f"{prefill_macs(cfg, prefill) / 1e9:.0f}",
                  *[f"{pre[n]:.2f}" if n in pre else "–" for n in threads])
    return t, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="measure at 1..N threads")
    ap.add_argument("--mib", type=int, default=512, help="the bandwidth tensor's size")
    ap.add_argument("--rows", type=int, default=128, help="rows of the peak products")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="smollm2-135m", help="the model the limits are computed for ('' for none)")
    ap.add_argument("--context", type=int, default=300, help="cached positions before the decode token")
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    a = ap.parse_args()
    if min(a.threads, a.mib, a.rows, a.reps, a.prefill_tokens) < 1 or a.context < 0:
        sys.exit("error: --threads, --mib, --rows, --reps and --prefill-tokens must be >= 1, --context >= 0")
    ROWS[0] = a.rows
    console = Console(width=200)
    console.print(f"{machine()}; {now()}")
    res = {n: measure(n, a.mib, a.rows, a.reps) for n in range(1, a.threads + 1)}
    console.print(host_table(res))
    rows: list[dict] = []
    if a.model:
        try:
            table, rows = model_table(a.model, res, a.context, a.prefill_tokens)
        except SpecLedgerError as exc:
            sys.exit(f"error: {exc}")
        console.print(table)
        console.print("decode limit: the fastest read GB/s (the sum's or the kernel's 1-row rate from memory) over the "
                      "bytes a token reads (engine/roofline.py); prefill limit: its "
                      "MACs over the precision's peak (A16: half the int8 peak, two digits a MAC)")
    if a.json:
        a.json.write_text(json.dumps({"machine": machine(), "when": now(), "kernel": qkernel.describe(),
                                      "host": res, "model": a.model, "context": a.context,
                                      "prefill_tokens": a.prefill_tokens, "precisions": rows}, indent=1))


if __name__ == "__main__":
    main()

"""What one matrix product costs per number of rows, per precision: the kernel-level reason behind
the verification-cost curve (a k-token verification multiplies k rows by every weight).

One weight of the embedded model's MLP shape (3072 x 576: the fused gate/up projection), multiplied
by M rows in fp32, bf16, W8A16 and W4A16 g32, alternating, median of several repeats. Prints µs and the
ratio to M = 1 for each precision.

    python benchmarks/linear_rows.py [--rows 1,2,3,4,8,16,32] [--threads 1] [--out 3072 --in 576]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from specledger.engine.quant import Int4Linear, Int8Linear, int4_grid


def median_us(fn, x: torch.Tensor, inner: int = 30, reps: int = 5) -> float:
    for _ in range(3):
        fn(x)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(x)
        ts.append((time.perf_counter() - t0) / inner * 1e6)
    return sorted(ts)[len(ts) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,3,4,8,16,32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=int, default=3072, help="output features")
    ap.add_argument("--in", dest="inp", type=int, default=576, help="input features (a multiple of 32)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    try:
        rows = [int(r) for r in a.rows.split(",")]
    except ValueError:
        sys.exit(f"--rows must be comma-separated integers (got {a.rows!r})")
    if min(rows) < 1 or a.out < 1 or a.inp % 32:
        sys.exit("rows and --out must be >= 1, and --in a multiple of 32 (the int4 group size)")
    w = torch.randn(a.out, a.inp) * 0.02
    wb = w.bfloat16()
    int8, int4 = Int8Linear(w, torch.bfloat16), Int4Linear(int4_grid(w, 32), torch.bfloat16, torch.device("cpu"))
    kinds = {
        "fp32": (lambda x: F.linear(x, w), torch.float32),
        "bf16": (lambda x: F.linear(x, wb), torch.bfloat16),
        "W8A16": (int8, torch.bfloat16),
        "W4A16 g32": (int4, torch.bfloat16),
    }
    res: dict[str, dict[int, float]] = {k: {} for k in kinds}
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, a.inp)
            for name, (fn, dt) in kinds.items():  # alternating precisions within each row count
                res[name][m] = median_us(fn, x.to(dt))
    t = Table(title=f"one {a.out}x{a.inp} product, µs (ratio to M=1), {a.threads} thread(s)")
    t.add_column("precision")
    for m in rows:
        t.add_column(f"M={m}", justify="right")
    for name, r in res.items():
        t.add_row(name, *[f"{r[m]:.0f} ({r[m] / r[rows[0]]:.1f}x)" for m in rows])
    Console(width=160).print(t)


if __name__ == "__main__":
    main()

"""What one matrix product costs per number of rows, per precision and per kernel: the kernel-level reason
behind the verification-cost curve (a k-token verification multiplies k rows by every weight).

One weight of the embedded model's MLP shape (3072 x 576: the fused gate/up projection), multiplied by M
rows, every contender alternating within each row count, median of several repeats. Prints µs and the
ratio to the first row count. Contenders:
  fp32 / bf16            F.linear (MKL / oneDNN)
  torch W8A16 / W4A16    PyTorch's packed kernels (_weight_int8pack_mm, _weight_int4pack_mm_for_cpu)
  engine W8 / W4 g32     the engine's kernel (engine/qkernel.py) on this host's best ISA (on an AMX host: AMX
                         from 6 rows on for W8, 10 for W4), and forced to VNNI without AMX (AMX hosts) and to AVX2;
                         "a8": activations as one int8 digit per value (activations=8, --activations 8; llama.cpp's
                         Q8 activations) instead of two
  --libs                 also the libraries that install from PyPI without a CUDA build, where importable:
                         bitsandbytes nf4 (Linear4bit), torchao int8 weight-only and intx int4 g32, hqq int4 g32,
                         optimum-quanto int8 (pip install torchao bitsandbytes hqq optimum-quanto --no-deps)

    python benchmarks/linear_rows.py [--rows 1,2,4,8,16,32] [--threads 1] [--out 3072 --in 576] [--libs]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn

from specledger.engine import qkernel
from specledger.engine.quant import Int4Linear, Int8Linear, int4_grid

Fn = Callable[[torch.Tensor], torch.Tensor]


def median_us(fn: Fn, x: torch.Tensor, inner: int = 30, reps: int = 5) -> float:
    for _ in range(3):
        fn(x)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(x)
        ts.append((time.perf_counter() - t0) / inner * 1e6)
    return sorted(ts)[len(ts) // 2]


def engine_contenders(w: torch.Tensor) -> dict[str, Fn]:
    out: dict[str, Fn] = {}
    if qkernel.op() is None:
        return out
    isa = qkernel.host_isa()
    forced = {"avx512-vnni+amx": [("avx512-vnni", 2), ("avx2", 1)], "avx512-vnni": [("avx2", 1)]}.get(isa, [])
    runs = [(label, code, 2) for label, code in [(isa, 0), *forced]]
    runs += [(f"{label} a8", code, 1) for label, code in [(isa, 0), *([("avx2", 1)] if isa != "avx2" else [])]]
    for label, code, digits in runs:
        q8, q4 = Int8Linear(w, torch.bfloat16), Int4Linear(int4_grid(w, 32), torch.bfloat16, torch.device("cpu"))
        q8.isa = q4.isa = code
        q8.digits = q4.digits = digits
        out[f"engine W8 (Q8_0) {label}"] = q8
        out[f"engine W4 g32 {label}"] = q4
    return out


def library_contenders(w: torch.Tensor) -> dict[str, Fn]:
    """Each library's CPU weight-only path on the same weight, where the library imports (skipped with a note)."""
    n, k = w.shape
    out: dict[str, Fn] = {}

    def linear() -> nn.Sequential:
        m = nn.Sequential(nn.Linear(k, n, bias=False)).bfloat16()
        m[0].weight.data = w.bfloat16()
        return m

    warnings.filterwarnings("ignore")
    try:
        import bitsandbytes as bnb

        lin = bnb.nn.Linear4bit(k, n, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
        lin.weight = bnb.nn.Params4bit(w.clone(), requires_grad=False, quant_type="nf4", blocksize=64)
        out["bitsandbytes nf4 b64"] = lin.to("cpu")
    except Exception as exc:
        print(f"bitsandbytes: skipped ({type(exc).__name__}: {str(exc)[:80]})")
    try:
        from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        m = linear()
        quantize_(m, Int8WeightOnlyConfig())
        out["torchao int8 weight-only"] = m
        m = linear()
        quantize_(m, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
        out["torchao intx int4 g32"] = m
    except Exception as exc:
        print(f"torchao: skipped ({type(exc).__name__}: {str(exc)[:80]})")
    try:
        from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

        lin = nn.Linear(k, n, bias=False)
        lin.weight.data = w.clone()
        out["hqq int4 g32"] = HQQLinear(lin, BaseQuantizeConfig(nbits=4, group_size=32), compute_dtype=torch.bfloat16,
                                        device="cpu")
    except Exception as exc:
        print(f"hqq: skipped ({type(exc).__name__}: {str(exc)[:80]})")
    try:
        from optimum.quanto import freeze, qint8, quantize

        m = linear()
        quantize(m, weights=qint8)
        freeze(m)
        out["optimum-quanto int8"] = m
    except Exception as exc:
        print(f"optimum-quanto: skipped ({type(exc).__name__}: {str(exc)[:80]})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=int, default=3072, help="output features")
    ap.add_argument("--in", dest="inp", type=int, default=576, help="input features (a multiple of 32)")
    ap.add_argument("--libs", action="store_true", help="also the PyPI libraries' CPU kernels, where installed")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    try:
        rows = [int(r) for r in a.rows.split(",")]
    except ValueError:
        sys.exit(f"--rows must be comma-separated integers (got {a.rows!r})")
    if min(rows) < 1 or a.out < 1 or a.inp % 32:
        sys.exit("rows and --out must be >= 1, and --in a multiple of 32 (the int4 group size)")
    torch.manual_seed(0)
    w = torch.randn(a.out, a.inp) * 0.02
    wb = w.bfloat16()
    with qkernel.disabled():  # PyTorch's own packed kernels
        t8, t4 = Int8Linear(w, torch.bfloat16), Int4Linear(int4_grid(w, 32), torch.bfloat16, torch.device("cpu"))
    kinds: dict[str, Fn] = {
        "fp32 F.linear": lambda x: F.linear(x.float(), w),
        "bf16 F.linear": lambda x: F.linear(x, wb),
        "torch W8A16 per-channel": t8,
        "torch W4A16 g32": t4,
        **engine_contenders(w),
    }
    if a.libs:
        kinds.update(library_contenders(w))
    ref = torch.randn(4, a.inp)
    exact = ref @ w.t()
    err = {}
    res: dict[str, dict[int, float]] = {k: {} for k in kinds}
    with torch.inference_mode():
        for name, fn in kinds.items():
            y = fn(ref.bfloat16()).float()
            err[name] = float((y - exact).norm() / exact.norm())
        for m in rows:
            x = torch.randn(m, a.inp).bfloat16()
            for name, fn in kinds.items():  # alternating contenders within each row count
                res[name][m] = median_us(fn, x)
    t = Table(title=f"one {a.out}x{a.inp} product, µs (ratio to M={rows[0]}), {a.threads} thread(s), bf16 inputs")
    t.add_column("contender")
    t.add_column("rel. err", justify="right")
    for m in rows:
        t.add_column(f"M={m}", justify="right")
    for name, r in res.items():
        t.add_row(name, f"{err[name]:.3f}", *[f"{r[m]:.0f} ({r[m] / r[rows[0]]:.1f}x)" for m in rows])
    Console(width=200).print(t)
    print("rel. err: ||y - x W^T|| / ||x W^T|| against the unquantized fp32 weight (quantization error included)")


if __name__ == "__main__":
    main()

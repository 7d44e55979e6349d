"""The engine's own CPU kernels (csrc/: quantized products, fused decode ops, bf16 products for hosts without bf16
arithmetic): built once with the installed torch, cached, loaded.

PyTorch's CPU int4/int8 weight-only kernels are fast only on AVX-512 hosts and cost grows with every row
(benchmarks/linear_rows.py); this kernel runs integer dot products on AVX2 or AVX-512 VNNI (chosen at run
time) and reuses each unpacked weight block across a tile of rows; where the CPU has AMX-INT8 (and Linux grants
the tile state), products of several rows (6 with 8-bit weights, 10 with 4-bit) take tile products instead: VNNI's dot products are compute-bound
once there are several rows, a tile product costs the same for 1 row as for 16. AMX's results equal VNNI's bit
for bit (the same integer sums, the same float order). It is compiled by the system's C++
compiler against the venv's own torch (no build isolation, no CUDA), into the cache directory, keyed by
the source, the torch version and the flags. Where it cannot be had (another OS or architecture, no
compiler, a failed build) `op()` returns None after one line on stderr and the engine uses PyTorch's
kernels. SPECLEDGER_QKERNEL=off disables it; =avx2 forces the AVX2 path on an AVX-512 host, =vnni VNNI without AMX,
=amx AMX for every product however few its rows (tests, benchmarks).

    python -m specledger.engine.qkernel      # build now (make install does), print where and which ISA
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

CSRC = Path(__file__).with_name("csrc")
# the quantized products: one file per instruction-set path (qmm_avx2, qmm_vnni, qmm_amx) and qmm.cpp choosing
# among them; one library with the fused ops and the bf16 products (AVX2 only)
SOURCES = [CSRC / name for name in ("qmm.cpp", "qmm_avx2.cpp", "qmm_vnni.cpp", "qmm_amx.cpp", "fused.cpp",
                                    "bf16mm.cpp")]
HEADERS = [CSRC / "simd.h", CSRC / "qmm_common.h"]  # included by the sources: part of the cache key
ISAS = {0: "none", 1: "avx2", 2: "avx512-vnni", 3: "avx512-vnni+amx"}
FLAGS = ["-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-fno-math-errno", "-Wno-unused-function"]

_state: dict[str, Any] = {}


def cache_dir() -> Path:
    base = os.environ.get("SPECLEDGER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specledger"
    )
    return Path(base) / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name:
            return shutil.which(name)  # CXX, when set, is the only one tried
    return None


def _command(cxx: str, out: Path) -> list[str]:
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    inc = [f"-I{p}" for p in cpp_extension.include_paths()]
    return [cxx, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *inc, *map(str, SOURCES), "-o", str(out),
            f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}"]


def library_path() -> Path:
    text = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    key = hashlib.sha256(text + torch.__version__.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return cache_dir() / f"qmm-{key}.so"


def build(quiet: bool = False) -> Path:
    """Compile the kernel into the cache (atomically: concurrent builds are harmless); return its path."""
    if platform.machine().lower() not in ("x86_64", "amd64") or sys.platform not in ("linux", "darwin"):
        raise RuntimeError(f"no kernel for {sys.platform}/{platform.machine()} (x86-64 Linux or macOS only)")
    path = library_path()
    if path.exists():
        return path
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError(f"no C++ compiler found ({os.environ.get('CXX') or 'c++, g++, clang++'}; set CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"specledger: building the quantized-product kernel into {path.parent} (once)", file=sys.stderr)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        res = subprocess.run(_command(cxx, Path(tmp)), capture_output=True, text=True)
        if res.returncode:
            lines = res.stderr.strip().splitlines() or ["(no output)"]
            first = next((ln for ln in lines if "error" in ln), lines[-1])
            raise RuntimeError(f"compiler failed: {first.strip()[:300]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _notice(msg: str) -> None:
    print(f"specledger: {msg}; using PyTorch's quantized kernels", file=sys.stderr)


def op() -> Any | None:
    """torch.ops.specledger.qmm, built and loaded on first use; None where it cannot run (said once)."""
    if _state.get("disabled"):
        return None
    if "op" in _state:
        return _state["op"]
    _state["op"] = None
    if os.environ.get("SPECLEDGER_QKERNEL", "").lower() in ("off", "0", "no", "torch"):
        return None
    try:
        path = build()
        if not hasattr(torch.ops.specledger, "qmm"):
            torch.ops.load_library(str(path))
        if torch.ops.specledger.qmm_isa() == 0:
            raise RuntimeError("this CPU lacks AVX2/FMA/F16C")
    except Exception as exc:  # any failure means: use PyTorch's kernels, and say so once
        _notice(f"quantized-product kernel unavailable ({exc})")
        return None
    _state["op"] = torch.ops.specledger.qmm.default
    return _state["op"]


@contextmanager
def disabled() -> Iterator[None]:
    """Modules built inside use PyTorch's kernels (benchmarks side by side, tests of the fallback)."""
    saved = _state.get("disabled", False)
    _state["disabled"] = True
    try:
        yield
    finally:
        _state["disabled"] = saved


def host_isa() -> str:
    """The instruction set the kernel runs with on this host ('none' when it is unavailable)."""
    return ISAS[int(torch.ops.specledger.qmm_isa())] if op() is not None else "none"


def requested_isa() -> int:
    """0 = the best this host has for each product's rows; 1 = AVX2 (SPECLEDGER_QKERNEL=avx2), 2 = AVX-512 VNNI
    without AMX (=vnni), 3 = AMX for every product, however few its rows (=amx)."""
    return {"avx2": 1, "vnni": 2, "amx": 3}.get(os.environ.get("SPECLEDGER_QKERNEL", "").lower(), 0)


def describe() -> str:
    """Which CPU product path serves quantized (and AVX2 bf16) products in this process, for run.json, the report
    and /health: the engine's kernel and its instruction set, or PyTorch's kernels and why."""
    if os.environ.get("SPECLEDGER_QKERNEL", "").lower() in ("off", "0", "no", "torch"):
        return "PyTorch's kernels (SPECLEDGER_QKERNEL=off)"
    if op() is None:
        return "PyTorch's kernels (the engine's kernel is unavailable here)"
    forced = {1: "avx2", 2: "avx512-vnni", 3: "avx512-vnni+amx"}.get(requested_isa())
    return f"specledger kernel, {host_isa()}" + (f", forced to {forced}" if forced else "")


OPT_OUT = "SPECLEDGER_ALLOW_NO_KERNEL"


def main() -> None:
    """`make install`: build the kernel and say which path it will use. A failed build on a host that should have
    one fails the install (exit 1) unless the user opts out with SPECLEDGER_ALLOW_NO_KERNEL=1 (PyTorch's kernels:
    slower quantized products); hosts with no kernel at all (not x86-64) install without it."""
    if platform.machine().lower() not in ("x86_64", "amd64") or sys.platform not in ("linux", "darwin"):
        print(f"quantized-product kernel: none for {sys.platform}/{platform.machine()}; PyTorch's kernels serve")
        return
    try:
        path = build()
        torch.ops.load_library(str(path))
    except Exception as exc:
        if os.environ.get(OPT_OUT, "").lower() in ("1", "yes", "true"):
            _notice(f"quantized-product kernel not built ({exc}; {OPT_OUT} set)")
            return
        print(f"error: the quantized-product kernel did not build: {exc}\n"
              f"  (install a C++ compiler or set CXX; or install without it, slower, with {OPT_OUT}=1)",
              file=sys.stderr)
        sys.exit(1)
    print(f"quantized-product kernel: {path}; this host will use: {describe()}")


if __name__ == "__main__":
    main()

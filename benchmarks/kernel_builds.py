"""Two builds of the quantized-product kernel side by side: the sources of a git revision (the base) against the
work tree's, on the products of one decode step of a model shape (default: Qwen2.5-1.5B at W4A16, 28 layers of
Q/K/V, O, gate|up and down at 4 bits plus the int8 LM head over 151,936 words), random weights, one activation row.

    python benchmarks/kernel_builds.py [--base HEAD] [--threads 2] [--rounds 5] [--clock wall|cpu]

Each build runs in its own process (both register torch.ops.specledger.qmm), base, new and the base again (the
A/A twin), alternating round by round; the products' sums are printed so the builds can be seen to agree. --clock
cpu times process CPU time, which a busy machine disturbs less than wall time (one thread only: with more, CPU
time counts the workers' spinning too).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import machine, now  # noqa: E402

QWEN15 = dict(hidden=1536, inter=8960, qkv=2048, layers=28, vocab=151936)


def build_revision(rev: str) -> Path:
    """The kernel from `rev`'s csrc, compiled into the kernel cache under its own key (once)."""
    import torch

    from specledger.engine import qkernel

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        csrc = Path(tmp)
        names = [p.name for p in (*qkernel.SOURCES, *qkernel.HEADERS)]
        rel = qkernel.CSRC.relative_to(root)
        for name in names:
            text = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{rel}/{name}"], capture_output=True,
                                  check=True).stdout
            (csrc / name).write_bytes(text)
        key = hashlib.sha256(b"".join((csrc / n).read_bytes() for n in names) + torch.__version__.encode()
                             + " ".join(qkernel.FLAGS).encode()).hexdigest()[:16]
        out = qkernel.cache_dir() / f"qmm-{key}.so"
        if not out.exists():
            cxx = qkernel._compiler()
            assert cxx, "no C++ compiler"
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = qkernel._command(cxx, out)
            srcs = {str(p) for p in qkernel.SOURCES}
            cmd = [str(csrc / Path(c).name) if c in srcs else c for c in cmd] + [f"-I{csrc}"]
            subprocess.run(cmd, check=True)
        return out


def child(so: str, threads: int, steps: int, clock: str) -> None:
    import torch

    from specledger.engine import qkernel

    qkernel.build = lambda quiet=False: Path(so)  # this process loads the given build
    from specledger.engine.quant import Int4Grid, Int4Linear, Int8Grid, Int8Linear

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    s, dev = QWEN15, torch.device("cpu")
    shapes = [(s["qkv"], s["hidden"]), (s["hidden"], s["hidden"]), (2 * s["inter"], s["hidden"]),
              (s["hidden"], s["inter"])]

    def grid4(n: int, k: int) -> Int4Grid:  # random codes straight away (the cost does not depend on them)
        return Int4Grid(torch.randint(0, 16, (n, k), dtype=torch.uint8), torch.rand(n, k // 32) * 1e-3 + 1e-4,
                        torch.randn(n, k // 32) * 1e-3, 32)

    mats = [(Int4Linear(grid4(n, k), torch.bfloat16, dev), k) for _ in range(s["layers"]) for n, k in shapes]
    head = Int8Grid(torch.randint(-127, 128, (s["vocab"], s["hidden"]), dtype=torch.int8),
                    (torch.rand(s["vocab"], s["hidden"] // 32) * 1e-3 + 1e-4).half().float())
    mats.append((Int8Linear(head, torch.bfloat16, dev), s["hidden"]))
    xs = {k: torch.randn(1, 1, k, dtype=torch.bfloat16) for k in (s["hidden"], s["inter"])}
    tick = time.process_time if clock == "cpu" else time.perf_counter
    with torch.inference_mode():
        times = []
        for i in range(steps + 2):
            t = tick()
            for m, k in mats:
                m(xs[k])
            if i >= 2:
                times.append(tick() - t)
        check = sum(float(m(xs[k]).float().sum()) for m, k in (mats[2], mats[-1]))
    print(f"RESULT {statistics.median(times) * 1e3:.3f} {check:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="git revision whose csrc is the base build (default HEAD)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per process (median)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), int(a.child[2]), a.child[3])
        return
    from specledger.engine import qkernel

    builds = {"base": build_revision(a.base), "new": qkernel.build()}
    order = [("base", builds["base"]), ("new", builds["new"]), ("base-twin", builds["base"])]
    res: dict[str, list[float]] = {name: [] for name, _ in order}
    for r in range(a.rounds):
        for name, so in order:
            out = subprocess.run([sys.executable, __file__, "--child", str(so), str(a.threads), str(a.steps),
                                  a.clock], capture_output=True, text=True)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")), None)
            if line is None:
                sys.exit(out.stderr[-2000:])
            ms, check = line.split()[1:]
            res[name].append(float(ms))
            print(f"round {r + 1} {name:9s} {float(ms):8.2f} ms  (products' sum {check})", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"\n{now()}  {machine()}  kernel threads {a.threads}, clock {a.clock}, base {a.base}")
    print(f"step products: base {med['base']:.2f} ms, new {med['new']:.2f} ms, base twin {med['base-twin']:.2f} ms")
    print(f"new/base {med['new'] / med['base']:.3f}   A/A base-twin/base {med['base-twin'] / med['base']:.3f}")


if __name__ == "__main__":
    main()

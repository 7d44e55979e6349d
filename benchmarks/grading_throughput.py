"""How fast execution grading runs (issue 53: at least 20 items a second on 2 cores).

Grades HumanEval's 164 canonical solutions through the sandbox (quality/execute.py grade_many) at 2, 4 and 8
concurrent runs, the rounds interleaved, with 4 workers run twice (an A/A pair: its spread is the noise floor).
Prints items per second per round and the machine's load average before and after (a busy machine says so).
Needs the fetched workload: `specledger workloads --fetch humaneval`.

    python benchmarks/grading_throughput.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time

from specledger.bench.datasets import require
from specledger.quality.execute import grade_many, sandbox_description
from specledger.records.question import CodeTask


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with gzip.open(require("humaneval"), "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    pairs = [(r["prompt"] + r["canonical_solution"], CodeTask(r["prompt"], r["test"], r["entry_point"]))
             for r in rows]
    print(f"sandbox: {sandbox_description()}")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    contenders = [("w2", 2), ("w4", 4), ("w4-twin", 4), ("w8", 8)]
    rates: dict[str, list[float]] = {name: [] for name, _ in contenders}
    for _ in range(args.rounds):
        for name, workers in contenders:
            t0 = time.perf_counter()
            results = list(grade_many(pairs, workers=workers))
            rates[name].append(len(pairs) / (time.perf_counter() - t0))
            assert all(r.passed for r in results), [r for r in results if not r.passed][:3]
    for name, rs in rates.items():
        print(f"{name:8s} " + "  ".join(f"{r:5.1f}" for r in rs) + " items/s")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

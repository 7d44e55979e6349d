"""The harness's own ceiling: requests/s the HTTP backend sustains against a server that answers at once.

The fake server (tests/support/fake_openai_server.py, zero delay) runs in its own process; the full harness
(load generator, streaming client, per-request records written to requests.jsonl, aggregates) runs
here at concurrency 64. If this figure is far above what a real server does, the harness is never
the bottleneck of a measurement.

    python benchmarks/harness_overhead.py [--requests 2000] [--concurrency 64] [--tokens 8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=8, help="streamed tokens per answer (one per chunk)")
    ap.add_argument("--target", type=float, default=500.0, help="requests/s the harness must sustain")
    args = ap.parse_args()

    from specledger.records.config import parse_run_config
    from specledger.bench.runner import run_benchmark

    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "fake_openai_server.py")],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"fake server did not start: {line!r}")
        port = int(line.split()[1])
        cfg = parse_run_config({
            "configs": [{"name": "http", "backend": "openai", "model": "fake-model", "max_tokens": args.tokens,
                         "openai": {"base_url": f"http://127.0.0.1:{port}", "scrape_metrics": False}}],
            "workload": {"spec": f"synthetic:in=16,out={args.tokens},n=64"},
            "load": {"concurrency": [args.concurrency], "num_requests": args.requests, "warmup": 0},
            "bootstrap": 200,
        })
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            result, _ = run_benchmark(cfg, run_dir=Path(tmp) / "run", show_progress=False)
            elapsed = time.perf_counter() - t0
    finally:
        server.terminate()
        server.wait(10)
    a = result.configs[0].loads[0].aggregate
    rps = a.requests_s or 0.0
    print(f"harness overhead: {a.requests_ok} ok / {a.requests_failed} failed requests, {args.tokens} streamed "
          f"tokens each, concurrency {args.concurrency}")
    print(f"  measurement phase {a.wall_s:.2f} s -> {rps:.0f} requests/s ({a.output_tok_s:.0f} tokens/s); "
          f"whole run incl. setup and aggregates {elapsed:.2f} s")
    print(f"  TTFT p50 {a.ttft.p50 * 1000:.2f} ms, p99 {a.ttft.p99 * 1000:.2f} ms (queueing in the client and "
          f"server at concurrency {args.concurrency})")
    verdict = "meets" if rps >= args.target else "BELOW"
    print(f"  {verdict} the target of {args.target:.0f} requests/s")
    sys.exit(0 if rps >= args.target else 1)


if __name__ == "__main__":
    main()

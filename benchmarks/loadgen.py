"""Load generator throughput: requests/s the HTTP backend sustains at high concurrency against a fast local fake.

The goal (issue 13): at least 2,000 requests/s at concurrency 256 with tiny answers and no model. The fake
servers (tests/fake_openai_server.py, zero delay, one token per answer) run in their own processes, several of
them so the fake is not the ceiling; the client drives them through the OpenAI backend's own round robin over
`base_urls`. The client is the closed loop of the harness (one coroutine per slot, `OpenAIBackend.complete`),
in one event loop or split over `--workers` processes (concurrency divided between them, all starting together).
Requests served are counted twice: by the client and by the servers' own counters (`/metrics`).

    python benchmarks/loadgen.py [--concurrency 256] [--duration 10] [--workers 1] [--servers 2] [--tokens 1]
    python benchmarks/loadgen.py --profile          # one worker under cProfile: where the client's time goes
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import multiprocessing as mp
import pstats
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


async def _drive(urls: list[str], concurrency: int, start_at: float, duration: float, tokens: int) -> dict:
    from specledger.bench.backends.openai_http import OpenAIBackend
    from specledger.bench.config import BenchConfig, OpenAISettings

    cfg = BenchConfig(name="loadgen", backend="openai", model="fake-model", max_new_tokens=tokens,
                      openai=OpenAISettings(base_urls=urls, scrape_metrics=False, timeout_s=60))
    backend = OpenAIBackend(cfg)
    await backend.start()
    messages = [{"role": "user", "content": "hi"}]
    counts = {"ok": 0, "failed": 0, "errors": {}}
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))  # every worker process starts together
        stop = time.perf_counter() + duration

        async def slot() -> None:
            while time.perf_counter() < stop:
                c = await backend.complete(messages, max_new_tokens=tokens)
                if c.ok:
                    counts["ok"] += 1
                else:
                    counts["failed"] += 1
                    counts["errors"][c.error_kind] = counts["errors"].get(c.error_kind, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(slot() for _ in range(concurrency)))
        counts["wall_s"] = time.perf_counter() - t0  # the last requests in flight finish past `duration`
    finally:
        await backend.close()
    return counts


def _worker(args: tuple[list[str], int, float, float, int]) -> dict:
    return asyncio.run(_drive(*args))


def _served(urls: list[str]) -> float:
    total = 0.0
    for u in urls:
        for line in httpx.get(f"{u}/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:request_success_total"):
                total += float(line.split()[-1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    ap.add_argument("--workers", type=int, default=1, help="client processes, each its own event loop")
    ap.add_argument("--servers", type=int, default=2, help="fake server processes (round robin over them)")
    ap.add_argument("--tokens", type=int, default=1, help="streamed tokens per answer")
    ap.add_argument("--target", type=float, default=2000.0, help="requests/s the load generator must sustain")
    ap.add_argument("--profile", action="store_true", help="one worker in this process under cProfile")
    args = ap.parse_args()

    servers = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_openai_server.py")],
                                stdout=subprocess.PIPE, text=True) for _ in range(args.servers)]
    try:
        urls = []
        for s in servers:
            line = s.stdout.readline() if s.stdout else ""
            if not line.startswith("PORT "):
                raise SystemExit(f"fake server did not start: {line!r}")
            urls.append(f"http://127.0.0.1:{int(line.split()[1])}")
        served0 = _served(urls)
        start_at = time.time() + 1.0 + 0.5 * args.workers  # time for the workers to import and connect
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            results = [_worker((urls, args.concurrency, start_at, args.duration, args.tokens))]
            prof.disable()
        else:
            per = [args.concurrency // args.workers + (i < args.concurrency % args.workers)
                   for i in range(args.workers)]
            with mp.get_context("spawn").Pool(args.workers) as pool:
                results = pool.map(_worker, [(urls, c, start_at, args.duration, args.tokens) for c in per])
        served = _served(urls) - served0
    finally:
        for s in servers:
            s.terminate()
        for s in servers:
            s.wait(10)

    ok = sum(r["ok"] for r in results)
    failed = sum(r["failed"] for r in results)
    wall = max(r["wall_s"] for r in results)
    rps = ok / wall
    print(f"load generator: concurrency {args.concurrency}, {args.workers} client process(es), "
          f"{args.servers} fake server process(es), {args.tokens} token(s) per answer")
    print(f"  {ok} ok / {failed} failed in {wall:.2f} s -> {rps:.0f} requests/s "
          f"(servers counted {served:.0f} answered)")
    for r in results:
        if r["errors"]:
            print(f"  errors: {r['errors']}")
    if args.profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    verdict = "meets" if rps >= args.target else "BELOW"
    print(f"  {verdict} the target of {args.target:.0f} requests/s")
    sys.exit(0 if rps >= args.target else 1)


if __name__ == "__main__":
    main()

"""Load generator throughput: requests/s the HTTP backend sustains at high concurrency against a fast local fake.

The goal (issue 13): at least 2,000 requests/s at concurrency 256 with tiny answers and no model. The fake
servers (tests/support/fake_openai_server.py, zero delay, one token per answer) run in their own processes, several of
them so the fake is not the ceiling; the client drives them through the OpenAI backend's own round robin over
`base_urls`. The client is the closed loop of the harness (one coroutine per slot, `OpenAIBackend.complete`),
in one event loop or split over `--workers` processes (concurrency divided between them, all starting together;
default: one per CPU). Client and fakes run on uvloop's event loop where it is installed (`--no-uvloop`: asyncio's).
Requests served are counted twice: by the client and by the servers' own counters (`/metrics`).

    python benchmarks/loadgen.py [--concurrency 256] [--duration 10] [--workers N] [--servers 2] [--tokens 1]
    python benchmarks/loadgen.py --profile          # one worker under cProfile: where the client's time goes
    python benchmarks/loadgen.py --compare "workers=1,uvloop=0" "workers=2,uvloop=1" --rounds 3
        # settings side by side, interleaved round by round: requests/s per setting and its ratio to the first
        # (on a busy machine read the ratios, not the absolute figures)

Exit status 0 when the (last) run meets --target requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


async def _drive(urls: list[str], concurrency: int, start_at: float, duration: float, tokens: int) -> dict:
    from specledger.bench.backends.openai_http import OpenAIBackend
    from specledger.records.config import BenchConfig, OpenAISettings

    cfg = BenchConfig(name="loadgen", backend="openai", model="fake-model", max_tokens=tokens,
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
                c = await backend.complete(messages, max_tokens=tokens)
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


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def _worker(args: tuple[list[str], int, float, float, int, bool]) -> dict:
    *drive, fast = args
    if fast:
        import uvloop

        return uvloop.run(_drive(*drive))
    return asyncio.run(_drive(*drive))


def _served(urls: list[str]) -> float:
    total = 0.0
    for u in urls:
        for line in httpx.get(f"{u}/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:request_success_total"):
                total += float(line.split()[-1])
    return total


def run_once(concurrency: int, duration: float, workers: int, servers: int, tokens: int, fast: bool,
             profile: bool = False) -> dict:
    """One measurement: fresh fake servers, the client's workers, requests/s as the client and the servers saw it."""
    cmd = [sys.executable, str(ROOT / "tests" / "support" / "fake_openai_server.py")] + (["--uvloop"] if fast else [])
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(servers)]
    prof = None
    try:
        urls = []
        for s in procs:
            line = s.stdout.readline() if s.stdout else ""
            if not line.startswith("PORT "):
                raise SystemExit(f"fake server did not start: {line!r}")
            urls.append(f"http://127.0.0.1:{int(line.split()[1])}")
        served0 = _served(urls)
        start_at = time.time() + 1.0 + 0.5 * workers  # time for the workers to import and connect
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            results = [_worker((urls, concurrency, start_at, duration, tokens, fast))]
            prof.disable()
        else:
            per = [concurrency // workers + (i < concurrency % workers) for i in range(workers)]
            with mp.get_context("spawn").Pool(workers) as pool:
                results = pool.map(_worker, [(urls, c, start_at, duration, tokens, fast) for c in per])
        served = _served(urls) - served0
    finally:
        for s in procs:
            s.terminate()
        for s in procs:
            s.wait(10)
    ok = sum(r["ok"] for r in results)
    wall = max(r["wall_s"] for r in results)
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {"ok": ok, "failed": sum(r["failed"] for r in results), "wall_s": wall, "rps": ok / wall,
            "served": served, "errors": errors, "profile": prof}


def _settings(text: str, base: argparse.Namespace) -> dict:
    """"workers=2,uvloop=1,servers=2" over the command line's values."""
    out = {"workers": base.workers, "servers": base.servers, "uvloop": base.uvloop}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in out:
            raise SystemExit(f"--compare: unknown setting {key!r} (workers, servers, uvloop)")
        out[key] = int(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="client processes, each its own event loop (default: one per CPU)")
    ap.add_argument("--servers", type=int, default=2, help="fake server processes (round robin over them)")
    ap.add_argument("--tokens", type=int, default=1, help="streamed tokens per answer")
    ap.add_argument("--target", type=float, default=2000.0, help="requests/s the load generator must sustain")
    ap.add_argument("--no-uvloop", dest="uvloop", action="store_false", default=_has_uvloop(),
                    help="asyncio's own event loop even where uvloop is installed")
    ap.add_argument("--profile", action="store_true", help="one worker in this process under cProfile")
    ap.add_argument("--compare", nargs="+", default=None, metavar="SETTINGS",
                    help='settings to run side by side, e.g. "workers=1,uvloop=0" "workers=2"')
    ap.add_argument("--rounds", type=int, default=3, help="with --compare: interleaved rounds")
    args = ap.parse_args()
    if args.uvloop and not _has_uvloop():
        raise SystemExit("uvloop is not installed (pip install uvloop), or pass --no-uvloop")

    print(f"load generator: concurrency {args.concurrency}, {args.tokens} token(s) per answer, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.compare:
        sets = [_settings(t, args) for t in args.compare]
        rps: list[list[float]] = [[] for _ in sets]
        for rnd in range(args.rounds):
            order = list(range(len(sets))) if rnd % 2 == 0 else list(reversed(range(len(sets))))
            for i in order:
                st = sets[i]
                r = run_once(args.concurrency, args.duration, st["workers"], st["servers"], args.tokens,
                             bool(st["uvloop"]))
                rps[i].append(r["rps"])
                print(f"  round {rnd} {args.compare[i]}: {r['rps']:.0f} requests/s ({r['failed']} failed, servers "
                      f"counted {r['served']:.0f})")
        print("setting                         median req/s   x first (per round, median)")
        for i, text in enumerate(args.compare):
            ratio = statistics.median(a / b for a, b in zip(rps[i], rps[0]))
            print(f"  {text:30s} {statistics.median(rps[i]):10.0f}   {ratio:.2f}")
        best = max(statistics.median(x) for x in rps)
        sys.exit(0 if best >= args.target else 1)

    r = run_once(args.concurrency, args.duration, args.workers, args.servers, args.tokens, args.uvloop, args.profile)
    print(f"  {args.workers if not args.profile else 1} client process(es), {args.servers} fake server process(es), "
          f"{'uvloop' if args.uvloop else 'asyncio'} event loops")
    print(f"  {r['ok']} ok / {r['failed']} failed in {r['wall_s']:.2f} s -> {r['rps']:.0f} requests/s "
          f"(servers counted {r['served']:.0f} answered)")
    if r["errors"]:
        print(f"  errors: {r['errors']}")
    if r["profile"] is not None:
        out = io.StringIO()
        pstats.Stats(r["profile"], stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    verdict = "meets" if r["rps"] >= args.target else "BELOW"
    print(f"  {verdict} the target of {args.target:.0f} requests/s")
    sys.exit(0 if r["rps"] >= args.target else 1)


if __name__ == "__main__":
    main()

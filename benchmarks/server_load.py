"""Load test of `specledger serve`, driven by the harness's OpenAI HTTP backend.

Starts the server as a subprocess (so its memory is its own), then for each concurrency level
runs a bounded number of chat requests (closed loop, the built-in workload's first turns, small
max_tokens) and checks that:
  - every request is answered: a success or a proper 503 (queue full), none lost or failed otherwise;
  - the server's /metrics deltas agree with what the client counted (requests by status, prompt
    and generated tokens);
  - the server's resident memory stays bounded across levels.
Then it measures the HTTP path's overhead on TTFT at concurrency 1: against the server's own
engine TTFT for the same requests, and against in-process generate() on the same prompts
(interleaved prompt by prompt), checks the greedy outputs are the same, and stops the server
with SIGTERM (graceful shutdown).

    python benchmarks/server_load.py [--levels 1,4,16,64] [--requests 8,16,32,64] [--max-tokens 8]
                                     [--max-queue 16] [--strategy ar] [--json out.json]
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from specledger.bench.backends.openai_http import OpenAIBackend
from specledger.records.config import BenchConfig, OpenAISettings
from specledger.bench.load import closed_loop
from specledger.bench.telemetry import parse_prometheus, telemetry_delta
from specledger.bench.workload import load_workload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def counter(samples: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of the server process, MiB."""
    status = Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}/status").exists() else ""
    vals = {k: int(v.split()[0]) / 1024 for k, v in (ln.split(":", 1) for ln in status.splitlines() if ":" in ln)
            if k in ("VmRSS", "VmHWM")}
    if not vals:
        return psutil.Process(pid).memory_info().rss / 2**20, float("nan")
    return vals["VmRSS"], vals["VmHWM"]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "specledger.cli", "serve", "--model", args.model, "--strategy", args.strategy,
           "--port", str(port), "--max-queue", str(args.max_queue), "--log-level", "warning"]
    for p in args.param:
        cmd += ["--strategy-param", p]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("the server did not come up within 180 s")


async def run_level(backend: OpenAIBackend, prompts: list[str], concurrency: int, n: int, max_tokens: int) -> dict:
    done: list = []
    it = iter(range(n))

    async def job(i: int, _arrival: float) -> None:
        messages = [{"role": "user", "content": prompts[i % len(prompts)]}]
        done.append((i, await backend.complete(messages, max_tokens=max_tokens)))

    before = await backend.scrape_metrics()
    t0 = time.perf_counter()
    await closed_loop(job, lambda: next(it, None), concurrency)
    wall = time.perf_counter() - t0
    after = await backend.scrape_metrics()
    ok = [c for _, c in done if c.ok]
    busy = [c for _, c in done if not c.ok and (c.error or "").startswith("HTTP 503")]
    other = [c for _, c in done if not c.ok and not (c.error or "").startswith("HTTP 503")]
    b, a = parse_prometheus(before or ""), parse_prometheus(after or "")

    def delta(name: str, **labels: str) -> float:
        return counter(a, name, **labels) - counter(b, name, **labels)

    info, _levels = telemetry_delta(before, after)
    client = {"ok": len(ok), "503": len(busy), "other": len(other), "lost": n - len(done),
              "prompt_tokens": sum(c.prompt_tokens or 0 for c in ok),
              "generated_tokens": sum(c.usage_output_tokens or 0 for c in ok)}
    server = {"ok": delta("specledger:requests_total", status="200"), "503": delta("specledger:requests_total", status="503"),
              "all": delta("specledger:requests_total"),
              "prompt_tokens": delta("specledger:prompt_tokens_total"),
              "generated_tokens": delta("specledger:generation_tokens_total")}
    agree = (server["ok"] == client["ok"] and server["503"] == client["503"] and server["all"] == n
             and server["prompt_tokens"] == client["prompt_tokens"]
             and server["generated_tokens"] == client["generated_tokens"])
    ttft = [c.first_token - c.start for c in ok if c.first_token is not None]
    e2e = [c.end - c.start for c in ok]
    return {
        "concurrency": concurrency, "requests": n, "wall_s": wall, "client": client, "server": server,
        "metrics_agree": agree, "errors": sorted({c.error for c in other})[:3],
        "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95), "e2e_p50_s": pct(e2e, 50), "e2e_p95_s": pct(e2e, 95),
        "ok_per_s": len(ok) / wall, "answers_per_s": len(done) / wall,
        "server_rss_metric_mb": (info or {}).get("server_rss_bytes", float("nan")) / 2**20,
    }


async def drive(args: argparse.Namespace, url: str, prompts: list[str], pid: int) -> tuple[list[dict], dict]:
    cfg = BenchConfig(name="server-load", backend="openai", model=args.model, max_tokens=args.max_tokens,
                      openai=OpenAISettings(base_url=url, retries=0, timeout_s=300, connect_timeout_s=30))
    backend = OpenAIBackend(cfg)
    await backend.start()
    try:
        await backend.complete([{"role": "user", "content": "Hello"}], max_tokens=2)  # warm-up
        rows = []
        for c, n in zip(args.levels, args.requests):
            row = await run_level(backend, prompts, c, n, args.max_tokens)
            row["rss_mb"], row["peak_rss_mb"] = rss_mb(pid)
            rows.append(row)
            cl, sv = row["client"], row["server"]
            print(f"c={c:<3} n={n:<3} ok={cl['ok']:<3} 503={cl['503']:<3} other={cl['other']} lost={cl['lost']} | "
                  f"server 200={sv['ok']:.0f} 503={sv['503']:.0f} prompt={sv['prompt_tokens']:.0f}/"
                  f"{cl['prompt_tokens']} gen={sv['generated_tokens']:.0f}/{cl['generated_tokens']} "
                  f"agree={row['metrics_agree']} | TTFT p50 {row['ttft_p50_s']:.3f} p95 {row['ttft_p95_s']:.3f} s "
                  f"e2e p50 {row['e2e_p50_s']:.3f} p95 {row['e2e_p95_s']:.3f} s | {row['ok_per_s']:.2f} ok/s "
                  f"{row['answers_per_s']:.1f} answers/s | RSS {row['rss_mb']:.0f} MiB (peak {row['peak_rss_mb']:.0f})",
                  flush=True)
            if row["errors"]:
                print("   errors:", row["errors"])
        cmp = await compare_ttft(args, backend, prompts[: args.requests[0]])
        return rows, cmp
    finally:
        await backend.close()


def in_process_engine(args: argparse.Namespace):
    """generate() in this process with the server's configuration: prompt -> (text, TTFT)."""
    from specledger.decoding.factory import make_strategy
    from specledger.decoding.loop.generate import generate
    from specledger.decoding.sampling import SamplingParams
    from specledger.engine.loader import load_model
    from specledger.cli.server import parse_params

    lm = load_model(args.model)
    strategy = make_strategy(args.strategy, target=lm, **parse_params(args.param))
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    def run(prompt: str) -> tuple[str, float]:
        r = generate(strategy, lm.tokenizer.chat([{"role": "user", "content": prompt}]), sp)
        return r.text, r.ttft_s

    return run


async def compare_ttft(args: argparse.Namespace, backend: OpenAIBackend, prompts: list[str]) -> dict:
    """HTTP vs in-process TTFT, interleaved prompt by prompt (the CPU is shared with other work, so
    alternating keeps both sides under the same conditions); each side warmed on the prompt first."""
    run = await asyncio.to_thread(in_process_engine, args)
    rows = []
    for p in prompts:
        messages = [{"role": "user", "content": p}]
        await asyncio.to_thread(run, p)
        text, local = await asyncio.to_thread(run, p)
        await backend.complete(messages, max_tokens=args.max_tokens)
        c = await backend.complete(messages, max_tokens=args.max_tokens)
        ext = c.extra.get("specledger", {})
        rows.append({"local_ttft": local, "http_ttft": c.first_token - c.start,
                     "server_ttft": ext["ttft_s"] + ext["queue_s"], "same": c.text == text})
    return {k: [r[k] for r in rows] for k in rows[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--strategy", default="ar")
    ap.add_argument("--param", action="append", default=[], help="strategy key=value")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--requests", default="8,16,32,64", help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=16)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    args.requests = [int(x) for x in args.requests.split(",")]
    if len(args.levels) != len(args.requests):
        ap.error("--levels and --requests need the same number of entries")

    prompts = [q.turns[0] for q in load_workload("builtin", per_category=None)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"server: {args.model} strategy={args.strategy} {args.param} max_queue={args.max_queue}; "
          f"max_tokens={args.max_tokens}; {len(prompts)} built-in prompts; CPUs {os.cpu_count()}", flush=True)
    t_start = time.perf_counter()
    proc = start_server(args, port)
    print(f"server up in {time.perf_counter() - t_start:.1f} s, RSS {rss_mb(proc.pid)[0]:.0f} MiB", flush=True)
    try:
        rows, cmp = asyncio.run(drive(args, url, prompts, proc.pid))
    finally:
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "killed after 60 s"
        print(f"SIGTERM -> server exited ({code}) in {time.perf_counter() - t0:.2f} s", flush=True)

    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    over = [h - e for h, e in zip(cmp["http_ttft"], cmp["server_ttft"])]
    vs_local = [h - e for h, e in zip(cmp["http_ttft"], cmp["local_ttft"])]
    n_same = sum(cmp["same"])
    print(f"TTFT, c=1, {len(over)} prompts, warm, medians: HTTP client {ms(cmp['http_ttft']):.1f} ms | the server's "
          f"own engine TTFT + queue wait for those requests {ms(cmp['server_ttft']):.1f} ms -> HTTP path overhead "
          f"{ms(over):.1f} ms (p90 {pct(over, 90) * 1e3:.1f} ms) | in-process generate() {ms(cmp['local_ttft']):.1f} ms "
          f"-> HTTP minus in-process {ms(vs_local):.1f} ms (p90 {pct(vs_local, 90) * 1e3:.1f} ms)")
    print(f"greedy outputs identical server vs in-process: {n_same}/{len(over)}")

    rss = [r["rss_mb"] for r in rows]
    checks = {
        "no request lost": all(r["client"]["lost"] == 0 for r in rows),
        "every answer a success or a 503": all(r["client"]["other"] == 0 for r in rows),
        "server metrics agree with the client": all(r["metrics_agree"] for r in rows),
        "RSS bounded (last level within 15% of the first)": rss[-1] <= rss[0] * 1.15,
        "greedy outputs identical": n_same == len(over),
    }
    for k, v in checks.items():
        print(f"check: {k}: {'PASS' if v else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "levels": rows, "ttft": cmp, "checks": checks},
                                              indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

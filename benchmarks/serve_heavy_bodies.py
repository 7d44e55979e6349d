"""/health latency and a small request beside 8 maximal legal bodies at once (issue 56), the server in its own process.

Starts `specledger serve` (default limits, the embedded model) on a free loopback port, polls /health one request at
a time, and sends 8 bodies at once beside one small chat: 100k messages (3.3 MiB), then 970k emoji (3.7 MiB, under
--max-prompt-chars). Prints /health's median, p99 and max over each flood and the small chat's latency (the server is
warmed by three small chats first: the first request of a fresh server is slow on its own).

    python benchmarks/serve_heavy_bodies.py [--src DIR]   # DIR: another checkout's src/ to serve (before/after)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import httpx

MODEL = "smollm2-135m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 2}
BODIES = {
    "100k messages": ("/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 100_000, "max_tokens": 1}).encode()),
    "970k emoji": ("/v1/completions", json.dumps(
        {"model": MODEL, "prompt": "\U0001f600" * 970_000, "max_tokens": 1}, ensure_ascii=False).encode()),
}


def start(src: str | None) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, **({"PYTHONPATH": src} if src else {}))
    proc = subprocess.Popen([sys.executable, "-m", "specledger.cli", "serve", "--port", "0", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, env=env)
    said: list[str] = []
    threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")), daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start:\n" + "".join(said))
        if m := next((re.search(r"on (http://127.0.0.1:\d+)/v1", line) for line in list(said)
                      if "/v1" in line), None):
            url = m.group(1)
            break
        time.sleep(0.1)
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)


def poll(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=120) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.get(url + "/health")
            out.append(time.perf_counter() - t0)


def summary(lat: list[float]) -> str:
    s = sorted(lat)
    return (f"{len(s)} polls, median {statistics.median(s) * 1000:.1f} ms, "
            f"p99 {s[max(0, int(len(s) * 0.99) - 1)] * 1000:.1f} ms, max {s[-1] * 1000:.1f} ms")


def flood(url: str, path: str, body: bytes) -> str:
    stop = threading.Event()
    lat: list[float] = []
    codes: list[str] = []
    poller = threading.Thread(target=poll, args=(url, stop, lat))
    poller.start()
    while not lat:  # the poller is under way
        time.sleep(0.001)

    def send() -> None:
        r = httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=600)
        codes.append(f"{r.status_code} {r.json()['error']['code'] if r.status_code != 200 else ''}".strip())

    senders = [threading.Thread(target=send) for _ in range(8)]
    t0 = time.perf_counter()
    for s in senders:
        s.start()
    chat = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=600)
    chat_s = time.perf_counter() - t0
    for s in senders:
        s.join()
    took = time.perf_counter() - t0
    stop.set()
    poller.join()
    return (f"answers {sorted(set(codes))} x{len(codes)} in {took:.1f} s; small chat {chat.status_code} after "
            f"{chat_s * 1000:.0f} ms; /health: {summary(lat)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", help="serve this src/ directory (PYTHONPATH) instead of the installed package")
    args = ap.parse_args()
    proc, url = start(args.src)
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=600)
            print(f"warm-up small chat: {(time.perf_counter() - t0) * 1000:.0f} ms", flush=True)
        for kind, (path, body) in BODIES.items():
            print(f"8 x {kind}: {flood(url, path, body)}", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()

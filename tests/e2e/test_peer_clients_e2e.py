"""Clients no one here wrote against `specledger serve`: AIPerf and GuideLLM, each in its own venv under
.cache/peers (`make peers`, scripts/install-peers.sh; or $SPECLEDGER_PEERS). Skipped where absent, except in CI
(SPECLEDGER_REQUIRE_ENGINES=1).

The round trip, per peer: its run and specledger's own `bench --backend openai` run of the same load (the same 32
prompts, answers of exactly 16 tokens, concurrency 2) alternate against one server, two rounds (ours, peer, peer,
ours); each run is imported (the peer's) and priced (`specledger cost`). Checked, per run: the request count and the
generated tokens equal the server's own /metrics over that run's window; each client's mean TTFT and end-to-end
latency within 5% of the server's own histograms over its window. Between the two clients, medians over the rounds of
TTFT mean (its p50 is printed: bimodal at concurrency 2, see below), end-to-end mean, p50 and p95: (a) each
divided by the server's own mean for its window, so the comparison holds while the machine's speed drifts between
runs (on a shared 2-core machine the server's own mean latency moved 2x between windows); (b) raw, and as priced, when the server ran at the same speed under both in
every round (its mean end-to-end latency within 5%). Percentiles are compared where the two clients issued the same
load: requests in flight averaged over the run within 5% (else only the means, and the test says so), and only
where the machine was quiet (load average at most the CPU count + 1 before every run): on a busy machine percentiles of
32 requests moved by more than any fixed tolerance between runs of the same client (seen under load 4-7: e2e p95
over the server's mean 1.19-1.34 within one client's rounds), so there they are printed, not asserted.

Tolerance between clients: 5% plus each client's own A/A spread -- how far its two runs of the same load moved apart
on that statistic. A distribution's shape (p95 over mean, p50 over mean) moves between two runs of one client on a
busy machine: seen under load 5-7, our own two rounds' e2e p95 over the server's mean 1.31 and 1.17, TTFT p50 over
it 0.90 and 0.98, GuideLLM's e2e p50 over it 1.12 and 1.00; on a quiet machine the spreads are small. A
percentile's tolerance also takes each client's sampling error of it (the half-width of its bootstrap 95% CI over
both rounds' requests): two rounds can agree with each other by chance while the tail of 32 requests rests on one or
two slow ones. Output tokens within
10%: both peers count them by re-tokenizing the streamed text, where a chunk boundary can split what the server counted as one token (seen:
364 vs 384). The server is pinned to one CPU with one thread and the clients to the others where the machine has
two, and AIPerf's /metrics scraping (on by default) is off: both cost the server CPU while it decodes, which showed
as 1.5-2x longer latencies *measured by the server itself* under AIPerf -- a load difference, not a measurement one.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from specledger.bench.backends.openai_http import load_counting_tokenizer
from specledger.records.config import ServerSettings
from specledger.bench.managed import ManagedServer, repo_cache
from specledger.bench.peer_imports import import_aiperf, import_guidellm
from specledger.bench.metrics import dist
from specledger.records.results import Aggregate, load_run, read_requests
from specledger.bench.telemetry import parse_prometheus

pytestmark = [pytest.mark.slow, pytest.mark.peers]

ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(os.environ.get("SPECLEDGER_PEERS") or repo_cache() / "peers")
TOOLS = {"aiperf": PEERS / "aiperf" / "bin" / "aiperf", "guidellm": PEERS / "guidellm" / "bin" / "guidellm"}
HOW = "run `make peers` (scripts/install-peers.sh: AIPerf and GuideLLM from PyPI into .cache/peers)"
N, TOKENS, CONCURRENCY, ROUNDS = 32, 16, 2, 2
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def _cpus() -> tuple[list[str], list[str]]:
    """taskset prefixes: the server on one CPU, clients on another (nothing where that is impossible)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return [], []
    return ["taskset", "-c", str(cpus[0])], ["taskset", "-c", ",".join(map(str, cpus[1:]))]


SERVER_CPU, CLIENT_CPU = _cpus()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One `specledger serve` (W4A16, ar, one thread) for every client in this module, and the files they read."""
    d = tmp_path_factory.mktemp("peers")
    load_counting_tokenizer("smollm2-135m").hf.save_pretrained(d / "tokenizer")
    prompts = [f"Say a short fact number {i}." for i in range(N)]
    (d / "chat.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": p}],
                                                      "max_tokens": TOKENS, "min_tokens": TOKENS}) + "\n"
                                          for i, p in enumerate(prompts)))
    (d / "aiperf.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    (d / "guidellm.jsonl").write_text("".join(json.dumps({"prompt": p, "output_tokens_count": TOKENS}) + "\n"
                                              for p in prompts))
    command = " ".join(SERVER_CPU + ["{python} -m specledger.cli serve --model {model} --quant int4 --host {host} "
                                     "--port {port} --served-model-name smollm2-135m --log-level warning"])
    settings = ServerSettings(command=command, startup_timeout_s=300,
                              env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")})
    srv = ManagedServer(settings, model="smollm2-135m", log_path=d / "serve.log", name="serve")
    url = srv.start()
    try:
        for i in range(2):  # first requests pay one-off costs (kernels, allocator); no run should see them
            httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
                "model": "smollm2-135m", "max_tokens": TOKENS, "messages": [{"role": "user", "content": f"Hi {i}"}]})
        yield url, d
    finally:
        srv.stop()


def _server_totals(url: str) -> dict[str, float]:
    """The server's own totals: requests served, tokens generated, and its TTFT / end-to-end histograms."""
    want = {"request_success_total", "generation_tokens_total", "time_to_first_token_seconds_sum",
            "time_to_first_token_seconds_count", "e2e_request_latency_seconds_sum", "e2e_request_latency_seconds_count"}
    out = dict.fromkeys(want, 0.0)
    for (name, _labels), v in parse_prometheus(httpx.get(f"{url}/metrics", timeout=10).text).items():
        if name.startswith("specledger:") and name.split(":", 1)[1] in want:
            out[name.split(":", 1)[1]] += v
    return out


def _aiperf(url: str, d: Path, out: Path) -> Path:
    p = subprocess.run(
        CLIENT_CPU + [str(TOOLS["aiperf"]), "profile", "--model", "smollm2-135m", "--url", url, "--endpoint-type",
                      "chat", "--streaming", "--tokenizer", str(d / "tokenizer"), "--input-file",
                      str(d / "aiperf.jsonl"), "--custom-dataset-type", "single_turn", "--request-count", str(N),
                      "--concurrency", str(CONCURRENCY), "--extra-inputs", f"max_tokens:{TOKENS}",
                      "--extra-inputs", f"min_tokens:{TOKENS}", "--extra-inputs", "temperature:0",
                      "--artifact-dir", str(out), "--ui-type", "none",
                      # its /metrics scraping (on by default) costs the server CPU while it decodes
                      "--no-server-metrics", "--no-gpu-telemetry", "--workers-max", "1",
                      "--record-processor-service-count", "1"],
        capture_output=True, text=True, timeout=600, cwd=out.parent)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    import_aiperf(out, out.with_name(out.name + "-run"), model="smollm2-135m")
    return out.with_name(out.name + "-run")


def _guidellm(url: str, d: Path, out: Path) -> Path:
    p = subprocess.run(
        CLIENT_CPU + [str(TOOLS["guidellm"]), "run", "--backend",
                      f"kind=openai_http,target={url},model=smollm2-135m,request_format=/v1/chat/completions",
                      "--profile", f"kind=concurrent,streams={CONCURRENCY}", "--constraint",
                      f"kind=max_requests,count={N}", "--data", f"kind=json_file,path={d / 'guidellm.jsonl'}",
                      "--tokenizer", f"kind=huggingface_auto,model={d / 'tokenizer'}",
                      "--output", f"kind=json,path={out}.json", "--disable-console-interactive"],
        capture_output=True, text=True, timeout=600, cwd=out.parent)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    import_guidellm(Path(f"{out}.json"), out.with_name(out.name + "-run"))
    return out.with_name(out.name + "-run")


def _ours(url: str, d: Path, out: Path) -> Path:
    cfg = {"configs": [{"name": "specledger", "backend": "openai", "model": "smollm2-135m", "max_tokens": TOKENS,
                        "openai": {"base_url": url}}],
           "workload": {"spec": f"chat:{d / 'chat.jsonl'}"},
           "load": {"concurrency": [CONCURRENCY], "num_requests": N, "warmup": 0}, "bootstrap": 0,
           "verify_curve": False}
    (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(cfg))
    p = subprocess.run(CLIENT_CPU + [sys.executable, "-m", "specledger.cli", "bench", str(out.parent / f"{out.name}.yaml"),
                                     "--no-progress", "--output-dir", str(out.parent), "--run-id", out.name],
                       capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return out


RUN = {"ours": _ours, "aiperf": _aiperf, "guidellm": _guidellm}


def _priced(run_dir: Path, costs: Path) -> dict:
    """`specledger cost` on a run directory (ours or imported): its one priced row."""
    out = run_dir.with_suffix(".cost.json")
    p = subprocess.run([sys.executable, "-m", "specledger.cli", "cost", str(run_dir), "--inputs", str(costs),
                        "--samples", "0", "--json", str(out)], capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (row,) = json.loads(out.read_text())["configs"]
    return row


STATS = {"ttft.mean": "ttft", "ttft.p50": "ttft", "e2e.mean": "e2e", "e2e.p50": "e2e", "e2e.p95": "e2e"}  # -> histogram


def _stat(a: Aggregate, stat: str) -> float:
    dist, q = stat.split(".")
    return getattr(getattr(a, dist), q)


@pytest.mark.parametrize("peer", ["aiperf", "guidellm"])
def test_peer_round_trip_matches_our_own_run_and_the_server(served, tmp_path, peer, require_tool):
    require_tool(TOOLS[peer], peer, HOW, PEERS / f"{peer}.log")
    url, d = served
    costs = tmp_path / "costs.yaml"
    inputs = yaml.safe_load((ROOT / "src" / "specledger" / "ledger" / "default_costs.yaml").read_text())
    inputs["acceptance"]["pass_rate"] = 0.8  # neither run is graded: the same stated pass rate for both
    costs.write_text(yaml.safe_dump(inputs))
    runs: dict[str, list[tuple[Aggregate, dict[str, float], dict]]] = {"ours": [], peer: []}
    lines = []
    loads = []
    # each request's latency over the server's own mean for its run's window, every round pooled: the tails' sampling
    # error (below)
    pooled: dict[str, dict[str, list[float]]] = {who: {"ttft": [], "e2e": []} for who in runs}
    for k in range(ROUNDS):
        for who in (("ours", peer) if k % 2 == 0 else (peer, "ours")):
            loads.append(os.getloadavg()[0])
            before = _server_totals(url)
            run_dir = RUN[who](url, d, tmp_path / f"{who}{k}")
            after = _server_totals(url)
            window = {key: after[key] - before[key] for key in after}
            server = {"ttft": window["time_to_first_token_seconds_sum"] / window["time_to_first_token_seconds_count"],
                      "e2e": window["e2e_request_latency_seconds_sum"] / window["e2e_request_latency_seconds_count"]}
            a = load_run(run_dir).configs[0].loads[0].aggregate
            assert load_run(run_dir).configs[0].loads[0].load == f"c={CONCURRENCY}"
            runs[who].append((a, {**window, **server}, _priced(run_dir, costs)))
            for r in read_requests(run_dir):
                for hist in ("ttft", "e2e"):
                    pooled[who][hist].append(getattr(r, f"{hist}_s") / server[hist])
            lines.append(f"{who} round {k}: ok {a.requests_ok} tokens {a.output_tokens} | ttft p50 {a.ttft.p50:.3f} "
                         f"mean {a.ttft.mean:.3f} (server {server['ttft']:.3f}) | e2e p50 {a.e2e.p50:.3f} p95 "
                         f"{a.e2e.p95:.3f} mean {a.e2e.mean:.3f} (server {server['e2e']:.3f})")
    report = "\n".join(lines)
    print(report)
    for who, rs in runs.items():
        for a, w, row in rs:
            # counts: the client's, the server's over the same window, and the priced row's
            assert (a.requests_ok, a.requests_failed) == (N, 0) and w["request_success_total"] == N, report
            assert w["generation_tokens_total"] == N * TOKENS, report
            assert abs(a.output_tokens - N * TOKENS) <= 0.1 * N * TOKENS, report
            assert row["total"] is not None and (row["requests"], row["failed"]) == (N, 0)
            # each client measures what the server measured (plus the wire: a few ms)
            assert a.ttft.mean == pytest.approx(w["ttft"], rel=0.05, abs=0.01), f"{who} TTFT vs server\n{report}"
            assert a.e2e.mean == pytest.approx(w["e2e"], rel=0.05, abs=0.01), f"{who} e2e vs server\n{report}"
    ours_tokens = [a.output_tokens for a, _, _ in runs["ours"]]
    assert ours_tokens == [N * TOKENS] * ROUNDS  # ours counts the server's usage

    def values(a: Aggregate, w: dict[str, float], row: dict) -> dict[str, float]:
        v = {stat: _stat(a, stat) for stat in STATS}
        v |= {f"{stat}/server": _stat(a, stat) / w[hist] for stat, hist in STATS.items()}
        return v | {"server e2e": w["e2e"], "priced ttft_p50": row["ttft_p50"], "priced e2e_p95": row["e2e_p95"]}

    med = {who: {key: statistics.median(values(*r)[key] for r in rs) for key in values(*rs[0])}
           for who, rs in runs.items()}
    ours, theirs = med["ours"], med[peer]

    def tolerance(key: str) -> float:
        """5%, widened by how far each client's own runs of the same load moved apart (its A/A spread): two
        clients cannot be expected to agree more closely than each agrees with itself."""
        spread = 0.0
        for who in ("ours", peer):
            xs = [values(*r)[key] for r in runs[who]]
            spread += (max(xs) - min(xs)) / statistics.mean(xs)
        return 0.05 + spread + tail_error(key)

    def tail_error(key: str) -> float:
        """A percentile's sampling error: the half-widths of each client's bootstrap 95% CI of it over every round's
        requests, relative to it. p95 of 32 sits between the 30th and 31st of 32 sorted latencies, so it moves by
        half a slow request's excess when one more request is slow: the CI run (aiperf, 2026-12-06) had ours at 1.16
        over the server's mean in both rounds and AIPerf at 1.06 in both, each round's twin agreeing, so the A/A
        spread alone gave 8.5% against a 9% gap; on this machine the same test saw 1.15 and 1.05 within each client."""
        stat = key.split("/")[0].replace("priced ", "").replace("_", ".")
        if stat.endswith(".mean"):
            return 0.0
        hist, q = stat.split(".")
        err = 0.0
        for who in ("ours", peer):
            d = dist(pooled[who][hist], resamples=2000)
            lo, hi = d.ci[q]
            err += (hi - lo) / 2 / getattr(d, q)
        return err

    # The load each client really issued: requests in flight, averaged over its run (sum of latencies over the span).
    # A peer that keeps fewer than `concurrency` in flight part of the time gives latencies another distribution (one
    # AIPerf run: e2e p50 over its mean 0.87 in both rounds, ours 1.0, the means agreeing with the server's), so
    # percentiles are compared only where the loads match within 5%.
    inflight = {who: statistics.median(a.e2e.mean * a.requests_ok / a.wall_s for a, _, _ in rs) for who, rs in runs.items()}
    print(f"requests in flight, time-averaged: {peer} {inflight[peer]:.2f}, ours {inflight['ours']:.2f}")
    assert inflight["ours"] == pytest.approx(CONCURRENCY, rel=0.05)
    same_load = inflight[peer] == pytest.approx(inflight["ours"], rel=0.05)
    # Percentiles of 32 requests are only as steady as the machine: where other work competed for the CPU (load
    # average above the CPU count + 1: this test itself keeps about two busy), they are reported, not asserted.
    quiet = max(loads) <= (os.cpu_count() or 1) + 1
    print(f"load average before each run: {[round(x, 1) for x in loads]} ({'quiet' if quiet else 'busy'})")
    # (a) drift-free: each run's statistic over the server's own mean for that run's window
    checked = [f"{stat}/server" for stat in STATS if stat.endswith(".mean") or (same_load and quiet)]
    if not (same_load and quiet):
        print(f"percentiles reported, not asserted: {'a busy machine' if same_load else 'another load'}")
    # the server's own mean TTFT and e2e under each client, per round: raw figures compare only where both agree
    # (seen: the server's TTFT 0.026 s under ours, 0.023-0.024 s under AIPerf, with the e2e within 2%: the raw
    # TTFT means then differed by 13% while each client's over the server's agreed within its tolerance)
    speeds = [(p[1][k], o[1][k]) for p, o in zip(runs[peer], runs["ours"]) for k in ("e2e", "ttft")]
    if same_load and quiet and all(x == pytest.approx(y, rel=0.05) for x, y in speeds):
        # (b) raw, when the server ran as fast under both clients in every round; and the latencies the ledger prices
        checked += [*STATS, "priced ttft_p50", "priced e2e_p95"]
    else:
        print(f"raw comparison not checked (server's mean e2e, ttft per round, {peer} vs ours: {speeds})")
    # TTFT's median is reported, not asserted: at concurrency 2 a request's TTFT is one of two modes (its prefill
    # alone, or beside the other stream's), and which mode holds the median of 32 depends on the two streams' phase,
    # which differs between clients by design (seen on a quiet machine: p50 over the server's mean TTFT 1.13 ours,
    # 1.02 GuideLLM, with the means within 1%).
    checked = [k for k in checked if not k.startswith("ttft.p50") and k != "priced ttft_p50"]
    for key in [k for k in values(*runs["ours"][0]) if k not in checked and "/server" in k]:
        print(f"{key}: {peer} {theirs[key]:.3f} ours {ours[key]:.3f} (reported only)")
    for key in checked:
        tol = tolerance(key)
        print(f"{key}: {peer} {theirs[key]:.3f} ours {ours[key]:.3f} (tolerance {tol:.1%})")
        assert theirs[key] == pytest.approx(ours[key], rel=tol), \
            f"{peer} {key} {theirs[key]:.3f} vs ours {ours[key]:.3f} (tolerance {tol:.1%})\n{report}"

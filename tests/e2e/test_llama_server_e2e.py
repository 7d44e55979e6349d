"""End to end: `specledger bench` against llama.cpp's server, started and stopped by specledger, on the embedded
GGUF, autoregressive and with llama.cpp's own n-gram speculation, at concurrency 1 and 4.

τ and acceptance measured by specledger (per request, from each response) must agree with llama-server's
own Prometheus counters over the same window (each load level's before/after scrape) within 2%.
Needs the binary: `make llama-server` (built once, ~15-25 min on 2 cores, cached in .cache/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specledger.bench.managed import LLAMA_SERVER_VERSION, find_llama_server, repo_cache
from specledger.records.results import load_run, read_requests
from specledger.report.positions import position_rows
from tests.bench.test_managed_server import port_is_free

pytestmark = [pytest.mark.slow, pytest.mark.peers]

SERVER = ("{llama_server} -m {model_path} --host {host} --port {port} -t 2 -c 4096 --parallel 4 --metrics "
          "--no-webui --seed 0")
NGRAM = " --spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 6"
PROMPTS = [
    "Repeat this list exactly, twice: apple, banana, cherry, date, fig, grape, kiwi, lemon.",
    "Write the numbers from 1 to 40, separated by commas.",
    "Copy this sentence three times: The quick brown fox jumps over the lazy dog.",
    "Continue the pattern: red blue green red blue green red blue green red blue green",
]


def _bench(tmp_path: Path) -> Path:
    wl = tmp_path / "copy.jsonl"
    wl.write_text("".join(json.dumps({"question_id": f"q{i}", "category": "copy", "turns": [p]}) + "\n"
                          for i, p in enumerate(PROMPTS)))
    common = {"backend": "openai", "model": "smollm2-135m", "max_tokens": 32}
    # llama-server sometimes drops a reused keep-alive connection before answering ("Server disconnected without
    # sending a response"; the request never reaches a slot, so its counters do not see it): retry those.
    transport = {"retries": 2}
    cfg = {
        "configs": [
            {"name": "llama-ar", "strategy": "ar", **common,
             "openai": {"server": {"command": SERVER, "startup_timeout_s": 300}, **transport}},
            {"name": "llama-ngram", "strategy": "ngram-simple", **common,
             "openai": {"server": {"command": SERVER + NGRAM, "startup_timeout_s": 300}, **transport}},
        ],
        "workload": {"spec": str(wl)},
        "load": {"concurrency": [1, 4], "num_requests": 8, "warmup": 1, "warmup_max_tokens": 4},
        "bootstrap": 0, "verify_curve": False,
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "specledger.cli", "bench", str(tmp_path / "cfg.yaml"), "--no-progress",
           "--output-dir", str(tmp_path), "--run-id", "run"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    print(p.stdout)
    return tmp_path / "run"


def test_tau_measured_by_specledger_matches_llama_servers_counters(tmp_path, require_tool):
    require_tool(find_llama_server(), "llama-server",
                 "run `make llama-server` once (~7-25 min on 2 cores; cached in .cache/ or $SPECLEDGER_CACHE), or set "
                 "SPECLEDGER_LLAMA_SERVER", repo_cache() / f"llama-server-{LLAMA_SERVER_VERSION}" / "build.log")
    path = _bench(tmp_path)
    run = load_run(path)
    recs = read_requests(path)
    assert run.status == "complete" and all(r.status == "ok" for r in recs) and len(recs) == 2 * 2 * 8
    for name in ("llama-ar", "llama-ngram"):
        log = (path / f"server-{name}.log").read_text()
        port = int(log.splitlines()[0].split("--port ")[1].split()[0])
        assert port_is_free(port), f"{name}: port {port} still bound after the run"

    ar, ngram = run.config("llama-ar"), run.config("llama-ngram")
    for lr in ar.loads:
        assert lr.aggregate.tau == pytest.approx(1.0) and lr.telemetry_levels == []

    for lr in ngram.loads:
        a, tele = lr.aggregate, lr.telemetry
        ours = {x.name: x for x in a.acceptance}["draft"]  # summed from every response's timings
        theirs = {x.name: x for x in lr.telemetry_levels}["llamacpp"]  # the server's counters, window delta
        n = a.requests_ok
        predicted = tele["counters"]["llamacpp:tokens_predicted_total"]
        assert predicted == pytest.approx(a.output_tokens, rel=0.02)
        assert ours.proposed > 0 and ours.accepted > 0, "no n-gram draft was proposed or accepted"
        assert ours.proposed == pytest.approx(theirs.proposed, rel=0.02)
        assert ours.accepted == pytest.approx(theirs.accepted, rel=0.02)
        # τ over all target steps: the server's tokens and accepted drafts over the same window
        tau_server = (predicted - n) / (predicted - n - theirs.accepted)
        assert a.tau == pytest.approx(tau_server, rel=0.02)
        # llama.cpp's own τ counts drafting steps only, so it is at least the all-steps τ
        assert tele["tau"]["llamacpp"] >= a.tau - 1e-9
        rates = theirs.position_rates
        assert rates and all(x >= y - 1e-12 for x, y in zip(rates, rates[1:]))  # position i needs i-1 accepted
        assert theirs.drafts and sum(theirs.accepted_per_position) == theirs.accepted
        # the report's table per configuration and level shows the server's rates
        shown = {(r.config, r.load, r.source): r.rates for r in position_rows(run)}
        assert shown[("llama-ngram", lr.load, "server counters: llamacpp")] == rates
        print(f"{lr.load}: tau specledger {a.tau:.3f} server(all steps) {tau_server:.3f} "
              f"server(drafting steps) {tele['tau']['llamacpp']:.3f}; acceptance {ours.accepted}/{ours.proposed} "
              f"vs {theirs.accepted}/{theirs.proposed}; per position {[round(x, 2) for x in rates]}")

"""The shipped real-pair recipe (examples/qwen-coder-pair.yaml) and llama-server's acceptance in a run.

The recipe must parse and every arm resolve without loading a model: the in-process arms name registry models,
and each llama-server arm renders to a command reading the same GGUF files (`-m` the 1.5B, `-md` the 0.5B)
with flags this build of llama-server knows (checked against its --help where the binary is built).
llama-server's acceptance is read from a recorded response of this build (tests/data/llama_server_draft_simple_*:
Qwen2.5-Coder 1.5B with `-md` the 0.5B, `--spec-type draft-simple --spec-draft-n-max 4`, 48 greedy tokens):
the per-response `timings` give totals (draft_n, draft_n_accepted), its /metrics the positions; both must land in
the records, the level's aggregate and the report's acceptance table. Needs neither the GGUFs nor the binary.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import pytest

from specledger.records.config import config_baselines, load_run_config, parse_run_config
from specledger.bench.managed import find_llama_server, render_command
from specledger.records.results import load_run, read_requests
from specledger.bench.runner import run_benchmark
from specledger.engine.registry import KNOWN_MODELS
from specledger.errors import BadInput
from specledger.ledger.inputs import load_inputs
from specledger.ledger.price import price_run
from specledger.report.html import write_report
from specledger.report.positions import position_rows
from tests.support.fake_openai_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "qwen-coder-pair.yaml"
DATA = ROOT / "tests" / "data"
STREAM = DATA / "llama_server_draft_simple_stream.txt"  # a streamed /v1/chat/completions, as received
METRICS = DATA / "llama_server_draft_simple_metrics.txt"  # /metrics after that one request
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
IN_PROCESS = {"ar-bf16", "ar-w4", "ar-w4-twin", "draft-w4", "draft-w4-fixed", "hier-w4", "lookup-w4",
              "ar-w4a8", "lookup-w4a8"}
SERVERS = {"llama-ar", "llama-ngram", "llama-draft"}


def _argv(cfg, monkeypatch) -> list[str]:
    """The server's argv with model names resolved to stand-in paths (no file, no binary needed)."""
    import specledger.engine.registry as registry

    monkeypatch.setattr(registry, "resolve_model", lambda name: Path(f"/models/{name}.gguf"))
    monkeypatch.setattr("specledger.bench.managed.find_llama_server", lambda: Path("/bin/llama-server"))
    s = cfg.openai.server
    return render_command(s.command, host="127.0.0.1", port=8080, model=cfg.model, run_dir=Path("/tmp"),
                          draft_model=s.draft_model)


def _after(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def test_the_shipped_pair_recipe_validates_and_every_arm_resolves(monkeypatch):
    run = load_run_config(RECIPE)
    by_name = {c.name: c for c in run.configs}
    assert set(by_name) == IN_PROCESS | SERVERS
    # one workload, one answer length, greedy, at concurrency 1 and 4, quality on the graded set, 2 threads
    assert run.load.concurrency == [1, 4] and run.workload.spec == "builtin" and run.threads == 2
    assert run.quality is not None and run.quality.spec == "builtin-graded"
    assert {c.max_tokens for c in run.configs} == {32} and all(c.greedy for c in run.configs)
    assert all(c.model == TARGET for c in run.configs)
    # the in-process arms: the precisions and strategies the issue asks for, on registry models
    assert {(c.strategy, c.dtype, c.quant, c.activations) for c in run.configs if c.backend == "inprocess"} == {
        ("ar", "bf16", "none", 16), ("ar", "bf16", "int4", 16),
        ("draft", "bf16", "int4", 16), ("hier", "bf16", "int4", 16), ("lookup", "bf16", "int4", 16),
        ("ar", "bf16", "int4", 8), ("lookup", "bf16", "int4", 8)}  # W4A8: llama.cpp's activation precision
    assert config_baselines(run.configs)["lookup-w4a8"] == "ar-w4a8"
    assert config_baselines(run.configs)["ar-w4-twin"] == "ar-w4"  # the A/A twin, measured against its elder
    assert by_name["draft-w4"].draft.model == DRAFT and by_name["draft-w4"].draft.quant == "int8"
    assert by_name["hier-w4"].intermediate.model == DRAFT and by_name["hier-w4"].params.drafter == "lookup"
    for c in run.configs:
        for spec in (c.target, c.draft, c.intermediate):
            assert spec is None or spec.model in KNOWN_MODELS, f"{c.name}: {spec.model} is not a registry model"
        if c.backend == "inprocess":
            assert c.openai is None
            continue
        # llama-server on the same files, 2 threads, speculation as named
        argv = _argv(c, monkeypatch)
        assert argv[0] == "/bin/llama-server" and _after(argv, "-m") == f"/models/{TARGET}.gguf"
        assert _after(argv, "-t") == "2" and _after(argv, "-tb") == "2" and "--metrics" in argv
        spec_type = _after(argv, "--spec-type") if "--spec-type" in argv else None
        assert {"llama-ar": None, "llama-ngram": "ngram-simple", "llama-draft": "draft-simple"}[c.name] == spec_type
        assert ("-md" in argv) == (c.name == "llama-draft")
    draft_argv = _argv(by_name["llama-draft"], monkeypatch)
    assert _after(draft_argv, "-md") == f"/models/{DRAFT}.gguf" and _after(draft_argv, "--spec-draft-n-max") == "4"
    # the same draft length on both engines
    assert by_name["draft-w4"].params.max_nodes == int(_after(draft_argv, "--spec-draft-n-max"))
    # the plan printed before the run names the server's draft model too
    from rich.console import Console

    from specledger.pipeline import plan_table

    console = Console(width=200, record=True)
    console.print(plan_table(run))
    row = next(ln for ln in console.export_text().splitlines() if "llama-draft" in ln)
    assert f"draft {DRAFT} (the server's)" in row


@pytest.mark.peers
def test_the_recipes_server_flags_are_this_builds(monkeypatch, require_tool):
    """Every flag of every llama-server arm is one the built binary lists (a renamed flag fails at start-up)."""
    from specledger.bench.managed import LLAMA_SERVER_VERSION, repo_cache

    binary = require_tool(find_llama_server(), "llama-server", "run `make llama-server` once",
                          repo_cache() / f"llama-server-{LLAMA_SERVER_VERSION}" / "build.log")
    text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60).stdout
    known, removed = set(), set()
    for block in re.split(r"\n(?=-)", text):  # one option per block: its flags, then (column 40 on) what it does
        first = block.split("\n", 1)[0]
        names = first[:40] if len(first) > 40 and first[39] == " " else first
        (removed if "has been removed" in block else known).update(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", names))
    types = re.search(r"--spec-type ([\w,-]+)", text)
    assert types, "this build's --help names no --spec-type list"
    for c in load_run_config(RECIPE).configs:
        if c.backend != "openai":
            continue
        argv = _argv(c, monkeypatch)
        flags = [w for w in argv[1:] if w.startswith("-") and not w.lstrip("-").isdigit()]
        assert flags and not [f for f in flags if f not in known], f"{c.name}: flags this build does not know"
        assert not removed & set(flags), f"{c.name}: flags this build refuses: {removed & set(flags)}"
        if "--spec-type" in argv:
            assert _after(argv, "--spec-type") in types.group(1).split(",")


def test_the_recipes_models_resolve_to_the_fetched_files_where_fetched():
    from specledger.engine.registry import ModelNotFound, resolve_model

    try:
        paths = {name: resolve_model(name) for name in (TARGET, DRAFT)}
    except ModelNotFound:
        pytest.skip("the Qwen GGUFs are not fetched (specledger models --fetch qwen2.5-coder-1.5b / -0.5b)")
    assert all(p.is_file() and p.suffix == ".gguf" for p in paths.values())
    assert paths[TARGET] != paths[DRAFT]


def test_a_draft_model_placeholder_needs_its_model(tmp_path):
    base = {"name": "s", "backend": "openai", "openai": {"server": {}}}

    def parse(server: dict) -> None:
        parse_run_config({"configs": [{**base, "openai": {"server": server}}]})

    with pytest.raises(BadInput, match=r"uses \{draft_model_path\}: give the model in draft_model"):
        parse({"command": "{llama_server} -m {model_path} -md {draft_model_path} --port {port}"})
    with pytest.raises(BadInput, match="draft_model is given but the command never uses"):
        parse({"command": "{llama_server} -m {model_path} --port {port}", "draft_model": DRAFT})
    parse({"command": "{llama_server} -m {model_path} -md {draft_model_path} --port {port}", "draft_model": DRAFT})
    with pytest.raises(BadInput, match="openai.server.draft_model"):
        render_command("x -md {draft_model_path}", host="h", port=1, model=TARGET, run_dir=tmp_path)
    argv = render_command("x {model} {draft_model}", host="h", port=1, model=TARGET, run_dir=tmp_path,
                          draft_model=DRAFT)
    assert argv == ["x", TARGET, DRAFT]


# ---- llama-server's acceptance from a recorded response --------------------------------------------------------


class ReplayServer(FakeOpenAIServer):
    """Answers every completion with the recorded stream, and /metrics with the recorded counters times the
    requests answered (what the server's counters would read after that many such requests)."""

    def __init__(self) -> None:
        super().__init__()
        self.stream = STREAM.read_bytes()
        self.metrics = METRICS.read_text()
        self.answered = 0

    def scaled_metrics(self) -> bytes:
        out = []
        for line in self.metrics.splitlines():
            name, _, value = line.rpartition(" ")
            if line.startswith("#") or "_total" not in name:
                out.append(line)
            else:
                out.append(f"{name} {float(value) * self.answered:g}")
        return ("\n".join(out) + "\n").encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in head[1:] if ":" in ln)}
                await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "POST":
                    body, kind = self.stream, "text/event-stream"
                    self.answered += 1
                elif path == "/metrics":
                    body, kind = self.scaled_metrics(), "text/plain; version=0.0.4"
                else:
                    body, kind = json.dumps({"data": [{"id": TARGET}]}).encode(), "application/json"
                writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                             "Connection: keep-alive\r\n\r\n".encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def test_llama_servers_draft_counts_land_in_records_aggregate_and_report(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"question_id": f"q{i}", "category": "coding", "turns": [p],
                                      "reference": ["contains:factorial"]}) + "\n"
                          for i, p in enumerate(["Write a factorial in Python.", "Write a factorial in C."])))
    with ReplayServer() as srv:
        cfg = parse_run_config({
            "configs": [{"name": "llama-draft", "backend": "openai", "model": TARGET, "strategy": "draft-simple",
                         "max_tokens": 48, "openai": {"base_url": srv.base_url, "connect_timeout_s": 5}}],
            "workload": {"spec": str(wl)}, "load": {"concurrency": [1], "warmup": 0}, "bootstrap": 0,
            "verify_curve": False, "calibration": False})
        _, path = run_benchmark(cfg, run_dir=tmp_path / "run", show_progress=False)
    recs = read_requests(path)
    assert len(recs) == 2 and all(r.status == "ok" for r in recs)
    for r in recs:  # the recorded response: 48 tokens, 39 drafted, 37 accepted, so 10 target steps after the first
        assert [(lv.name, lv.proposed, lv.accepted, lv.steps) for lv in r.levels] == [("draft", 39, 37, 10)]
        assert r.output_tokens == 48 and r.steps == 10 and r.tau == pytest.approx(47 / 10)
        assert r.extra["timings"]["draft_n"] == 39 and r.cached_prompt_tokens == 0
    lr = load_run(path).config("llama-draft").loads[0]
    assert [(a.name, a.proposed, a.accepted) for a in lr.aggregate.acceptance] == [("draft", 78, 74)]
    assert lr.aggregate.tau == pytest.approx(47 / 10)
    # the server's counters over the level: per position, 10 drafts a request accepted [10, 10, 9, 8]
    (server,) = lr.telemetry_levels
    assert (server.name, server.drafts, server.proposed, server.accepted) == ("llamacpp", 20, 78, 74)
    assert server.position_rates == pytest.approx([1.0, 1.0, 0.9, 0.8])
    rows = {r.source: r for r in position_rows(load_run(path))}
    assert rows["server counters: llamacpp"].rates == pytest.approx([1.0, 1.0, 0.9, 0.8])
    totals = rows["per request: draft (95% accepted; per position not exposed)"]
    assert (totals.accepted, totals.proposed, totals.rates) == (74, 78, [])
    # ... and in the report's acceptance table, both rows
    html = write_report(path, price_run(path, load_inputs(None), samples=0), tmp_path / "r.html").read_text()
    table = re.search(r'<table id="positions-table">(.*?)</table>', html, re.S).group(1)
    cells = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
             for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
    assert cells[1:] == [
        ["llama-draft", "c=1", "server counters: llamacpp", "20", "74 / 78", "100%", "100%", "90%", "80%"],
        ["llama-draft", "c=1", "per request: draft (95% accepted; per position not exposed)", "–", "74 / 78",
         "–", "–", "–", "–"]]

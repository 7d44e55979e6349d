"""The results directory: schema round-trip, torn lines, resume bookkeeping, summary.csv, show/diff."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone

import pytest
from rich.console import Console

from specledger.bench.metrics import aggregate
from specledger.records.results import (
    SCHEMA_VERSION, SUMMARY_COLUMNS, Conditions, ConfigResult, Dist, GateOutcome, LoadResult, RequestGrade,
    RequestLog, RequestRecord, RunResult, load_run, read_requests, write_run, write_summary,
)
from specledger.spec_stats import LevelStats
from specledger.bench.tables import diff_table, render_run
from specledger.errors import BadInput


def record(i: int, **kw) -> RequestRecord:
    base = dict(run_id="r1", config="ar", request_id=f"ar|c=1|{i}|t1", item=i, question_id=f"q{i}",
                category="qa", kind="qa", turn=1, turns=1, load="c=1", concurrency=1, status="ok",
                arrival_t=1000.0 + i, start_t=1000.0 + i, first_token_t=1000.1 + i, end_t=1001.0 + i, ttft_s=0.1,
                e2e_s=1.0, tpot_s=0.1, itl_s=[0.1] * 9, output_tokens=10, prompt_tokens=5, steps=4, tau=2.5,
                levels=[LevelStats(name="draft", proposed=8, accepted=6)], output_text="hi é ✓",
                output_token_ids=[1, 2, 3], grade=RequestGrade(passed=True, score=1.0, grader="exact"))
    base.update(kw)
    return RequestRecord(**base)


def make_run(run_id: str = "r1", tok_scale: float = 1.0) -> RunResult:
    recs = [record(i) for i in range(4)]
    agg = aggregate(recs, wall_s=4.0 / tok_scale, resamples=50)
    lr = LoadResult(load="c=1", concurrency=1, aggregate=agg, by_category={"qa": agg}, complete=True)
    cfg = ConfigResult(name="ar", backend="inprocess", model="m", strategy="ar", dtype="fp32", quant="none",
                       loads=[lr], gates=[GateOutcome(name="pass_rate", passed=True, reason="4/4")], pass_rate=1.0)
    cond = Conditions(python="3.11", specledger="0.1.0", platform="linux", config={"configs": []})
    return RunResult(run_id=run_id, created=datetime.now(timezone.utc), conditions=cond, configs=[cfg],
                     status="complete")


def test_request_record_round_trip(tmp_path):
    with RequestLog(tmp_path) as log:
        for i in range(3):
            log.append(record(i))
    back = read_requests(tmp_path)
    assert back == [record(i) for i in range(3)]
    assert all(r.schema_version == SCHEMA_VERSION for r in back)
    assert back[0].levels[0].rate == pytest.approx(0.75)


def test_latest_record_wins_and_torn_last_line_is_ignored(tmp_path):
    with RequestLog(tmp_path) as log:
        log.append(record(0, status="failed", error="boom", output_tokens=0))
        log.append(record(1))
        log.append(record(0))  # measured again after a resume
    with open(tmp_path / "requests.jsonl", "a") as f:
        f.write('{"schema_version": 1, "run_id": "r1", "conf')  # the process died mid-write
    recs = read_requests(tmp_path)
    assert [(r.item, r.status) for r in recs] == [(1, "ok"), (0, "ok")]
    assert len(read_requests(tmp_path, latest_only=False)) == 3


def test_bad_line_in_the_middle_is_an_error(tmp_path):
    (tmp_path / "requests.jsonl").write_text('{"nope": 1}\n' + record(0).model_dump_json() + "\n")
    with pytest.raises(BadInput, match=r"requests.jsonl:1: not a request record"):
        read_requests(tmp_path)


def test_run_json_round_trip_and_summary(tmp_path):
    run = make_run()
    write_run(tmp_path, run)
    write_summary(tmp_path, run)
    back = load_run(tmp_path)
    assert back == run
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert list(rows[0]) == SUMMARY_COLUMNS
    assert len(rows) == 1
    assert rows[0]["config"] == "ar" and float(rows[0]["tau"]) == pytest.approx(2.5)
    assert rows[0]["acceptance"] == "draft=0.7500"
    assert float(rows[0]["output_tok_s"]) == pytest.approx(10.0)

    # every latency column holds its own distribution's statistic (the figures made distinct to tell them apart)
    for i, metric in enumerate(("ttft", "tpot", "itl", "e2e")):
        setattr(run.configs[0].loads[0].aggregate, metric, Dist(n=4, mean=i + 0.1, p50=i + 0.2, p90=i + 0.3,
                                                                p95=i + 0.4, p99=i + 0.5))
    write_summary(tmp_path, run)
    row = next(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [float(row[f"{m}_{s}"]) for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p95", "p99")
            ] == pytest.approx([i + j / 10 for i in range(4) for j in range(1, 6)])


def test_load_run_errors(tmp_path):
    with pytest.raises(BadInput, match="not a specledger run directory"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(BadInput, match="not valid JSON"):
        load_run(tmp_path)
    data = json.loads(make_run().model_dump_json())
    data["schema_version"] = 99
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match="schema_version 99"):
        load_run(tmp_path)


def test_tables_render():
    a, b = make_run("A"), make_run("B", tok_scale=2.0)
    console = Console(width=250, record=True)
    console.print(render_run(a))
    text = console.export_text()
    assert "run A (complete)" in text and "c=1" in text and "draft 75%" in text
    console = Console(width=200, record=True)
    console.print(diff_table(a, b))
    text = console.export_text()
    assert "tok/s" in text and "2.00" in text  # B measured twice the throughput

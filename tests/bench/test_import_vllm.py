"""`specledger import vllm-bench`: a `vllm bench serve --save-result` file becomes a run the ledger prices.

The samples are written here in the layout vLLM's benchmarks/serve.py saves (vLLM 0.11-0.12): traffic settings
and totals at the top level, mean_/median_/std_/p<P>_<metric>_ms per metric named in --percentile-metrics
(milliseconds), and with --save-detailed the per-request lists input_lens, output_lens, ttfts (seconds),
itls (seconds, one list per request), generated_texts and errors (empty string = success).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specledger.bench.importers import import_vllm_bench
from specledger.records.results import load_run, read_requests
from specledger.cli import app
from specledger.errors import BadInput
from specledger.ledger.measurements import measurements_from_run

TOP = {"date": "20251201-061500", "endpoint_type": "openai-chat", "backend": "openai-chat", "label": None,
       "model_id": "HuggingFaceTB/SmolLM2-135M-Instruct", "tokenizer_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
       "num_prompts": 4, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2}

# --save-detailed: 4 requests, the last one failed
DETAILED = {
    **TOP, "duration": 2.0, "completed": 3, "failed": 1, "total_input_tokens": 60, "total_output_tokens": 12,
    "request_throughput": 1.5, "request_goodput": None, "output_throughput": 6.0, "total_token_throughput": 36.0,
    "input_lens": [20, 20, 20, 20], "output_lens": [4, 4, 4, 0],
    "ttfts": [0.1, 0.2, 0.3, 0.0],
    "itls": [[0.05, 0.05, 0.05], [0.1, 0.1, 0.1], [0.02, 0.02, 0.02], []],
    "generated_texts": ["a b c d", "e f g h", "i j k l", ""],
    "errors": ["", "", "", "HTTP 503: overloaded"],
    "max_output_tokens_per_s": 8.0, "max_concurrent_requests": 2,
    "mean_ttft_ms": 200.0, "median_ttft_ms": 200.0, "std_ttft_ms": 81.6, "p99_ttft_ms": 298.0,
}

# summary only (no --save-detailed), asked for --percentile-metrics ttft,tpot,e2el --metric-percentiles 50,95,99
SUMMARY = {
    **TOP, "max_concurrency": None, "request_rate": 4.0, "num_prompts": 100,
    "duration": 25.0, "completed": 98, "failed": 2, "total_input_tokens": 9800, "total_output_tokens": 12544,
    "request_throughput": 3.92, "request_goodput": None, "output_throughput": 501.76,
    "total_token_throughput": 893.76, "max_output_tokens_per_s": 700.0, "max_concurrent_requests": 9,
    "mean_ttft_ms": 40.0, "median_ttft_ms": 35.0, "std_ttft_ms": 9.0, "p50_ttft_ms": 35.0, "p95_ttft_ms": 61.0,
    "p99_ttft_ms": 80.0, "mean_tpot_ms": 12.0, "median_tpot_ms": 11.5, "std_tpot_ms": 1.0, "p50_tpot_ms": 11.5,
    "p95_tpot_ms": 14.0, "p99_tpot_ms": 15.0, "mean_e2el_ms": 1570.0, "median_e2el_ms": 1500.0,
    "std_e2el_ms": 100.0, "p50_e2el_ms": 1500.0, "p95_e2el_ms": 1800.0, "p99_e2el_ms": 1900.0,
}


def write(tmp_path, data, name="vllm.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_detailed_file_gives_request_records_and_a_priced_measurement(tmp_path):
    run = import_vllm_bench(write(tmp_path, DETAILED), tmp_path / "run")
    (c,) = run.configs
    assert c.name == "openai-chat-SmolLM2-135M-Instruct" and c.loads[0].load == "c=2"
    recs = read_requests(tmp_path / "run")
    assert [r.status for r in recs] == ["ok", "ok", "ok", "failed"] and recs[3].error == "HTTP 503: overloaded"
    assert recs[0].e2e_s == pytest.approx(0.25) and recs[1].e2e_s == pytest.approx(0.5)  # TTFT + sum of gaps
    assert recs[1].tpot_s == pytest.approx(0.1) and recs[2].itl_s == [0.02, 0.02, 0.02]
    a = c.loads[0].aggregate
    assert (a.requests_ok, a.requests_failed, a.output_tokens, a.wall_s) == (3, 1, 12, 2.0)
    assert a.ttft.p50 == pytest.approx(0.2) and a.output_tok_s == pytest.approx(6.0)
    (m,) = measurements_from_run(tmp_path / "run")
    assert (m.requests_completed, m.output_tokens, m.concurrency, m.load) == (3, 12, 2, "c=2")
    assert m.operating_point().device_seconds_per_call == pytest.approx(2.0 / 3)
    assert m.graded == 0 and len(m.requests) == 3
    assert any("not graded" in n for n in run.notes) and any("queueing" in n for n in run.notes)


def test_summary_only_file_keeps_vllms_percentiles(tmp_path):
    run = import_vllm_bench(write(tmp_path, SUMMARY), tmp_path / "run", name="vllm-eagle")
    assert read_requests(tmp_path / "run") == []
    lr = load_run(tmp_path / "run").config("vllm-eagle").loads[0]
    a = lr.aggregate
    assert lr.load == "r=4" and lr.rate == 4.0 and lr.concurrency is None
    assert (a.requests_ok, a.requests_failed, a.output_tokens) == (98, 2, 12544)
    assert (a.ttft.p50, a.ttft.p95, a.ttft.p99) == pytest.approx((0.035, 0.061, 0.080))
    assert (a.e2e.p95, a.tpot.mean) == pytest.approx((1.8, 0.012))
    assert a.itl.n == 0 and a.itl.mean is None  # ITL was not among the metrics asked for
    (m,) = measurements_from_run(tmp_path / "run")
    assert m.e2e_p95 == pytest.approx(1.8) and m.tok_s == pytest.approx(501.76)
    assert any("summary only" in n for n in run.notes)
    assert not any("no p95" in n for n in run.notes)


def test_summary_without_p95_says_how_to_get_it(tmp_path):
    data = {k: v for k, v in SUMMARY.items() if not k.startswith("p95_")}
    run = import_vllm_bench(write(tmp_path, data), tmp_path / "run")
    assert any("--metric-percentiles 50,90,95,99" in n for n in run.notes)


def test_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(BadInput, match="missing duration, completed"):
        import_vllm_bench(write(tmp_path, {"results": []}), tmp_path / "a")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(BadInput, match="not JSON"):
        import_vllm_bench(tmp_path / "bad.json", tmp_path / "b")
    with pytest.raises(BadInput, match="no such file"):
        import_vllm_bench(tmp_path / "nope.json", tmp_path / "c")
    import_vllm_bench(write(tmp_path, SUMMARY), tmp_path / "d")
    with pytest.raises(BadInput, match="already holds a run"):
        import_vllm_bench(write(tmp_path, SUMMARY), tmp_path / "d")


def test_cli_import(tmp_path):
    src = write(tmp_path, DETAILED)
    res = CliRunner().invoke(app, ["import", "vllm-bench", str(src), "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "results:" in res.output and load_run(tmp_path / "r").configs[0].loads[0].aggregate.requests_ok == 3
    res = CliRunner().invoke(app, ["import", "genai-perf", str(src)])
    assert isinstance(res.exception, BadInput) and "unknown format 'genai-perf'" in str(res.exception)


def test_summary_without_p95_meets_a_p95_objective_through_its_p99(tmp_path):
    """p95 <= p99: a p99 within the objective makes the p95 objective met; one above it names the bound."""
    from specledger.ledger.inputs import parse_inputs
    from specledger.ledger.price import price_run

    data = {k: v for k, v in SUMMARY.items() if not k.startswith("p95_")}  # p99 TTFT 80 ms
    import_vllm_bench(write(tmp_path, data), tmp_path / "run")
    base = ("hardware: {price_per_device_hour: 2.0}\nvolume: {tasks_per_month: 10000}\nacceptance: {pass_rate: 0.9, "
            "retries: 2, review_minutes: 0.5, fix_minutes: 10, wage_per_hour: 60}\n")
    (ok,) = price_run(tmp_path / "run", parse_inputs(base + "latency: {ttft_p95_s: 0.1}\n", "c.yaml"), samples=50).configs
    assert ok.feasible and ok.verdict != "infeasible" and ok.p_feasible == 1.0
    assert ok.ttft_p95 is None  # the table still says it was not measured
    (late,) = price_run(tmp_path / "run", parse_inputs(base + "latency: {ttft_p95_s: 0.05}\n", "c.yaml"),
                        samples=50).configs
    assert late.verdict == "infeasible" and late.misses == ["p95 TTFT <= p99 0.08 s (p95 not measured) > 0.05 s"]
    (m,) = measurements_from_run(tmp_path / "run")
    assert m.operating_point().p95_from_p99 == ("ttft", "tpot", "e2e")

"""`specledger import guidellm|aiperf` on files the real tools wrote (GuideLLM 0.8.1, AIPerf 0.13.0, each run
against `specledger serve` with the embedded model: 8 requests of 6 tokens at concurrency 2; trimmed copies in
tests/data). Expected values are computed by hand from the fixtures' numbers, written out below."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specledger.bench.peer_imports import import_aiperf, import_guidellm
from specledger.records.results import load_run, read_requests
from specledger.cli import app
from specledger.errors import BadInput

DATA = Path(__file__).parents[1] / "data"


def test_guidellm_report(tmp_path):
    run = import_guidellm(DATA / "guidellm_report.json", tmp_path / "g")
    lr = run.configs[0].loads[0]
    assert (lr.load, lr.concurrency) == ("c=2", 2)  # strategy concurrent, streams 2
    a = lr.aggregate
    assert (a.requests_ok, a.requests_failed, a.output_tokens) == (8, 0, 48)
    # TTFT (ms) sorted: 402.9996, 1087.8756, 1216.0735, 1233.0878, 1233.4747, 1356.4858, 1372.6020, 1401.8140
    assert a.ttft.p50 == pytest.approx((1233.0877780914307 + 1233.4747314453125) / 2 / 1000)
    assert a.ttft.mean == pytest.approx(9304.4130 / 8 / 1000, rel=1e-6)
    # end-to-end (s) sorted: .76078 1.50846 1.61644 1.68129 1.72016 1.76537 1.80703 1.83821
    assert a.e2e.p50 == pytest.approx((1.6812899112701416 + 1.7201550006866455) / 2)
    assert a.e2e.n == 8 and a.itl.n == 0  # GuideLLM keeps no per-token times
    # within 5% of GuideLLM's own medians (it reports a nearest-rank median: 1233.09 ms, 1.6813 s)
    assert a.ttft.p50 == pytest.approx(1.2330877780914307, rel=0.05)
    assert a.e2e.p50 == pytest.approx(1.6812899112701416, rel=0.05)
    recs = read_requests(tmp_path / "g")
    assert len(recs) == 8 and recs[0].output_text == "Shoutout, cute buddy"
    assert recs[0].tpot_s == pytest.approx((0.7607846260070801 - 0.4029996395111084) / 5)
    assert any("not graded" in n for n in run.notes) and any("ITL" in n for n in run.notes)
    assert load_run(tmp_path / "g").configs[0].model == "smollm2-135m"


def test_guidellm_report_with_null_metadata(tmp_path):
    """A report whose "metadata" is null imports all the same, its version unknown."""
    import json

    data = json.loads((DATA / "guidellm_report.json").read_text())
    data["metadata"] = None
    (tmp_path / "r.json").write_text(json.dumps(data))
    run = import_guidellm(tmp_path / "r.json", tmp_path / "g")
    assert run.configs[0].loads[0].aggregate.requests_ok == 8
    assert run.conditions.backends[run.configs[0].name].startswith("guidellm ? (")
    assert run.configs[0].spec["guidellm_version"] is None


def test_aiperf_export(tmp_path):
    run = import_aiperf(DATA / "aiperf_profile_export.jsonl", tmp_path / "a", model="smollm2-135m")
    lr = run.configs[0].loads[0]
    assert lr.load == "c=2"  # two requests overlap at most (aiperf --concurrency 2)
    a = lr.aggregate
    assert (a.requests_ok, a.requests_failed, a.output_tokens) == (8, 0, 48)
    # TTFT (ms) sorted: 1439.55 1511.68 1726.30 2450.80 3016.03 3177.04 3642.98 4570.85
    assert a.ttft.p50 == pytest.approx((2450.7987319999997 + 3016.0305359999998) / 2 / 1000)
    # request latency (ms) sorted: 2019.85 2134.08 2741.08 3266.81 4148.88 5038.70 5327.08 5739.03
    assert a.e2e.p50 == pytest.approx((3266.809139 + 4148.882644) / 2 / 1000)
    assert a.e2e.p90 == pytest.approx((5327.076282999999 + 0.3 * (5739.027966 - 5327.076282999999)) / 1000)
    assert a.itl.n == 8 * 5  # five inter-chunk gaps per 6-token answer
    recs = read_requests(tmp_path / "a")
    assert recs[0].itl_s[0] == pytest.approx(0.1236396)
    assert any("peak number of requests in flight" in n for n in run.notes)


def test_cli_imports_and_bad_input(tmp_path):
    r = CliRunner().invoke(app, ["import", "aiperf", str(DATA / "aiperf_profile_export.jsonl"),
                                 "--run-dir", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["import", "guidellm", str(DATA / "guidellm_report.json"),
                                 "--run-dir", str(tmp_path / "g")])
    assert r.exit_code == 0, r.output
    with pytest.raises(BadInput, match="not JSON.*GuideLLM report"):
        import_guidellm(DATA / "aiperf_profile_export.jsonl", tmp_path / "x")
    with pytest.raises(BadInput, match="not an AIPerf record"):
        (tmp_path / "v.jsonl").write_text('{"ttfts": []}\n')
        import_aiperf(tmp_path / "v.jsonl", tmp_path / "y")
    with pytest.raises(BadInput, match="already holds a run"):
        import_aiperf(DATA / "aiperf_profile_export.jsonl", tmp_path / "r")

"""Many replicas: client-side round robin over several base URLs, or a balancer URL plus per-replica metrics
URLs; counters scraped from each replica and summed. Two fake servers on 127.0.0.1."""

from __future__ import annotations

import pytest

from specledger.records.config import parse_run_config
from specledger.bench.telemetry import merge_replica_metrics, parse_prometheus, spec_counters
from specledger.errors import SpecLedgerError
from tests.support.fake_openai_server import FakeOpenAIServer, FakeSettings
from tests.bench.test_harness_http import config, run, write_workload

FAKE = {"spec_steps": 2, "draft_per_step": 3, "accepted_per_step": 1, "n_tokens": 4}


@pytest.fixture()
def pair():
    with FakeOpenAIServer(FakeSettings()) as a, FakeOpenAIServer(FakeSettings()) as b:
        yield a, b


def test_round_robin_over_base_urls(pair, tmp_path):
    a, b = pair
    wl = write_workload(tmp_path / "w.jsonl", [f"q{i}" for i in range(7)])
    cfg = config(a, tmp_path, wl, fake=FAKE, openai={"base_urls": [a.base_url, b.base_url]})
    result, recs, _ = run(cfg, tmp_path)
    assert (a.stats.completed, b.stats.completed) == (4, 3)  # 7 requests alternate, a first
    assert [r.extra["replica"] for r in recs[:3]] == [a.base_url, b.base_url, a.base_url]
    lr = result.configs[0].loads[0]
    # speculation counters summed over both replicas: 7 requests x 2 drafts of 3, 1 accepted each
    assert [(t.name, t.drafts, t.proposed, t.accepted) for t in lr.telemetry_levels] == [("vllm", 14, 42, 14)]
    reps = lr.telemetry["replicas"]
    assert reps[f"{a.base_url}/metrics"]["vllm:request_success_total"] == 4
    assert reps[f"{b.base_url}/metrics"]["vllm:request_success_total"] == 3
    assert lr.telemetry["counters"]["vllm:request_success_total"] == 7
    client = {r: c.get("specledger_client:replica_requests_total") for r, c in reps.items()}
    assert client == {f"{a.base_url}/metrics": 4, f"{b.base_url}/metrics": 3}


def test_balancer_url_with_per_replica_metrics(pair, tmp_path):
    a, b = pair
    # b already served traffic before the window: only window deltas count, summed with a's
    b.stats.drafts, b.stats.draft_tokens, b.stats.accepted_tokens = 100, 300, 50
    wl = write_workload(tmp_path / "w.jsonl", ["x", "y"])
    cfg = config(a, tmp_path, wl, fake=FAKE,
                 openai={"metrics_urls": [f"{a.base_url}/metrics", f"{b.base_url}/metrics"]})
    result, recs, _ = run(cfg, tmp_path)
    assert (a.stats.completed, b.stats.completed) == (2, 0)  # one URL: no round robin
    assert "replica" not in recs[0].extra
    lr = result.configs[0].loads[0]
    assert [(t.name, t.drafts, t.accepted) for t in lr.telemetry_levels] == [("vllm", 4, 4)]
    assert lr.telemetry["replicas"][f"{b.base_url}/metrics"]["vllm:request_success_total"] == 0


def test_merged_exposition_sums_counters_and_keeps_labels():
    one = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m \\"q\\""} 3\n'
    two = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m \\"q\\""} 5\n'
    samples = parse_prometheus(merge_replica_metrics({"http://r1/metrics": one, "http://r2/metrics": two}))
    assert spec_counters(samples)["vllm"]["num_drafts"] == 8
    assert {dict(k[1])["model_name"] for k in samples} == {'m "q"'}


def test_replica_urls_validated(tmp_path):
    wl = write_workload(tmp_path / "w.jsonl", ["x"])
    bad = {"configs": [{"name": "s", "backend": "openai", "openai": {"base_urls": ["127.0.0.1:1"]}}],
           "workload": {"spec": wl}}
    with pytest.raises(SpecLedgerError, match="base_urls must start with http"):
        parse_run_config(bad)
    # per-replica metrics endpoints: full URLs, each once
    for urls, why in ((["127.0.0.1:1/metrics"], "metrics_urls must start with http"),
                      (["http://r1/metrics", "http://r1/metrics"], "metrics_urls names a replica twice")):
        with pytest.raises(SpecLedgerError, match=why):
            parse_run_config({**bad, "configs": [{"name": "s", "backend": "openai", "openai": {"metrics_urls": urls}}]})

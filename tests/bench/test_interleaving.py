"""Interleaved runs: every configuration up at once, request by request in seeded random block order."""

from __future__ import annotations

import json

from tests.support.fake_backend import SleepBackend
from specledger.records.config import parse_run_config
from specledger.records.results import load_run, read_requests
from specledger.bench.runner import Runner


def _workload(tmp_path, n):
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"word{i} please"],
                                     "reference": [f"word{i}"]}) + "\n" for i in range(n)))
    return str(p)


def _run(tmp_path, name, *, n, interleave, seconds, repeats=1, seed=0):
    cfg = parse_run_config({
        "configs": [{"name": "twin-a", "max_tokens": 8}, {"name": "twin-b", "max_tokens": 8}],
        "workload": {"spec": _workload(tmp_path, n)}, "load": {"concurrency": [1], "warmup": 1},
        "bootstrap": 0, "interleave": interleave, "repeats": repeats, "seed": seed, "verify_curve": False,
    })
    calls: list[str] = []
    result = Runner(cfg, tmp_path / name, show_progress=False,
                    backend_factory=lambda bc: SleepBackend(bc, calls, seconds)).run()
    return result, read_requests(tmp_path / name), calls


def test_blocks_hold_every_configuration_once_in_seeded_random_order(tmp_path):
    result, recs, calls = _run(tmp_path, "a", n=6, interleave=True, seconds=lambda n, bc: 0.0, repeats=2)
    assert calls[:2] in (["twin-a", "twin-b"], ["twin-b", "twin-a"])  # one warm-up each, not recorded
    measured = calls[2:]
    assert len(measured) == len(recs) == 2 * 6 * 2
    blocks = [measured[i:i + 2] for i in range(0, len(measured), 2)]
    assert all(sorted(b) == ["twin-a", "twin-b"] for b in blocks)
    assert len({tuple(b) for b in blocks}) == 2  # both orders occur: the order is randomised
    for r in recs:
        assert r.block == r.item and r.slot in (0, 1) and r.repeat == r.item // 6
        assert calls[2 + 2 * r.block + r.slot] == r.config
    assert {r.repeat for r in recs} == {0, 1}
    run = load_run(tmp_path / "a")
    assert run.conditions.interleaved and run.conditions.order_seed == 0
    assert run.noise is not None and [p.when for p in run.noise.probes] == ["before", "during", "after"]
    assert run.noise.threads["cpu_count"] >= 1
    _, _, again = _run(tmp_path, "b", n=6, interleave=True, seconds=lambda n, bc: 0.0, repeats=2)
    assert again == calls  # seeded: the same order again
    _, _, other = _run(tmp_path, "c", n=6, interleave=True, seconds=lambda n, bc: 0.0, repeats=2, seed=1)
    assert other != calls


def test_drift_halfway_is_a_phantom_speedup_only_when_sequential(tmp_path):
    n = 16
    half = 1 + n  # warm-ups + half of the measured requests
    slow_later = lambda k, bc: 0.03 if k < half else 0.09  # the machine gets 3x slower halfway through

    def ratio(result):
        a, b = (result.config(x).loads[0].aggregate.output_tok_s for x in ("twin-a", "twin-b"))
        return a / b

    seq, seq_recs, _ = _run(tmp_path, "seq", n=n, interleave=False, seconds=slow_later)
    inter, inter_recs, _ = _run(tmp_path, "int", n=n, interleave=True, seconds=slow_later)
    # sequential: each configuration's level through the load loop, no blocks; interleaved: a block per item
    assert all(r.block is None for r in seq_recs) and all(r.block == r.item for r in inter_recs)
    assert ratio(seq) > 1.8  # twin-a ran before the slowdown, twin-b after
    assert 0.6 < ratio(inter) < 1.6


def test_quality_level_runs_once_per_target_and_stands_for_lossless_configurations(tmp_path):
    from specledger.ledger.measurements import measurements_from_run

    cfg = parse_run_config({
        "configs": [{"name": "ar", "max_tokens": 8}, {"name": "lookup", "strategy": "lookup", "max_tokens": 8},
                    {"name": "ar-w4", "dtype": "bf16", "quant": "int4", "max_tokens": 8}],
        "workload": {"spec": _workload(tmp_path, 4)}, "load": {"concurrency": [1], "warmup": 0},
        "quality": {"spec": "builtin-graded", "limit": 24}, "bootstrap": 0, "verify_curve": False,
        "calibration": False, "gates": {"quantization": False},
    })
    calls: list[str] = []
    result = Runner(cfg, tmp_path / "q", show_progress=False,
                    backend_factory=lambda bc: SleepBackend(bc, calls, lambda n, bc: 0.0)).run()
    recs = read_requests(tmp_path / "q")
    quality = [r for r in recs if r.load == "quality"]
    # 24 items (three have two turns) for ar and ar-w4 only: lookup is lossless on ar's target
    assert {r.config for r in quality} == {"ar", "ar-w4"}
    assert len({r.question_id for r in quality}) == 24
    assert result.config("lookup").quality_source == "ar" and result.config("ar-w4").quality_source == "ar-w4"
    ms = {m.name: m for m in measurements_from_run(tmp_path / "q")}
    assert all(m.load == "c=1" for m in ms.values())  # the quality level is not a priced operating point
    assert ms["lookup"].graded == ms["ar"].graded == 24 and ms["lookup"].grades == ms["ar"].grades
    assert ms["lookup"].passes == sum(r.grade.passed for r in quality if r.config == "ar" and r.turn == r.turns)

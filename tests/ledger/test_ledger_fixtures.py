"""Synthetic run directories written through the harness's own models (records/results.py).

Other ledger/report tests import `make_run`; the tests here check that the ledger reads back
exactly what was written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from specledger.bench.metrics import aggregate
from specledger.records.results import group_by
from specledger.records.results import (
    ConfigResult, Conditions, LoadResult, RequestGrade, RequestLog, RequestRecord, RunResult, now, write_run,
    write_summary,
)

KINDS = ("multi_turn", "translation", "summarization", "qa", "math", "rag")


@dataclass
class Spec:
    name: str
    strategy: str
    dtype: str = "fp32"
    quant: str = "none"
    service_s: float = 6.0  # mean seconds per request at c=1
    ttft_s: float = 0.3
    passes: int = 16  # of `n` graded
    tau: float | None = None
    concurrency: tuple[int, ...] = (1,)
    comparable: bool = True
    reason: str = ""
    graded: bool = True


DEFAULT_SPECS = [
    Spec("ar-fp32", "ar", service_s=6.0, passes=16),
    Spec("ar-w4", "ar", quant="int4", service_s=4.0, passes=12),
    Spec("eagle-fp32", "eagle", service_s=3.0, passes=16, tau=3.1),
    Spec("eagle-w4", "eagle", quant="int4", service_s=3.2, passes=12, tau=2.4),
    Spec("lookup-fp32", "lookup", service_s=4.5, passes=16, tau=1.6),
]


def make_run(root: Path, specs: list[Spec] = DEFAULT_SPECS, n: int = 20, seed: int = 0, tokens: int = 100) -> Path:
    """A complete run directory: requests.jsonl, run.json, summary.csv."""
    rng = np.random.default_rng(seed)
    run_dir = Path(root) / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    run = RunResult(run_id="synthetic", created=now(), status="complete",
                    conditions=Conditions(python="3.11", specledger="0.1.0", platform="test"))
    with RequestLog(run_dir) as log:
        for s in specs:
            loads = []
            for c in s.concurrency:
                records = []
                t = 1000.0
                for i in range(n):
                    kind = KINDS[i % len(KINDS)]
                    service = float(s.service_s * rng.uniform(0.8, 1.2))
                    queue = (c - 1) * s.service_s * 0.5 if c > 1 else 0.0
                    ttft = s.ttft_s * float(rng.uniform(0.8, 1.2)) + queue
                    e2e = service + queue
                    out = tokens + int(rng.integers(-10, 11))
                    records.append(RequestRecord(
                        run_id="synthetic", config=s.name, request_id=f"{s.name}|c={c}|{i}|t1", item=i,
                        question_id=str(i), category=kind, kind=kind, turn=1, turns=1, load=f"c={c}",
                        concurrency=c, status="ok", output_tokens=out, arrival_t=t, start_t=t + queue,
                        first_token_t=t + ttft, end_t=t + e2e, queue_s=queue, ttft_s=ttft, e2e_s=e2e,
                        tpot_s=(e2e - ttft) / (out - 1), steps=None if s.tau is None else int(out / s.tau),
                        tau=s.tau, grade=RequestGrade(passed=i < s.passes, grader="test") if s.graded else None,
                    ))
                    t += service / c  # c requests overlap: throughput grows with concurrency
                for r in records:
                    log.append(r)
                wall = sum(r.e2e_s - r.queue_s for r in records) / c
                agg = aggregate(records, wall_s=wall, resamples=0)
                by_kind = {k: aggregate(v, resamples=0) for k, v in group_by(records, "kind").items()}
                loads.append(LoadResult(load=f"c={c}", concurrency=c, aggregate=agg, by_kind=by_kind))
            run.configs.append(ConfigResult(
                name=s.name, backend="inprocess", model="smollm2-135m", strategy=s.strategy, dtype=s.dtype,
                quant=s.quant, group_size=32 if s.quant != "none" else None, loads=loads,
                pass_rate=s.passes / n, comparable=s.comparable, comparable_reason=s.reason,
            ))
    write_run(run_dir, run)
    write_summary(run_dir, run)
    return run_dir


def test_measurements_read_back(tmp_path):
    from specledger.ledger.measurements import measurements_from_run

    run_dir = make_run(tmp_path, [Spec("ar-fp32", "ar", concurrency=(1, 4)), Spec("eagle-w4", "eagle", quant="int4", tau=2.5)])
    ms = measurements_from_run(run_dir)
    assert [(m.name, m.load) for m in ms] == [("ar-fp32", "c=1"), ("ar-fp32", "c=4"), ("eagle-w4", "c=1")]
    m = ms[0]
    assert m.requests_completed == 20 and m.graded == 20 and m.passes == 16
    assert m.precision == "fp32" and ms[2].precision == "W4A32-g32"
    assert len(m.requests) == 20
    assert m.wall_s == pytest.approx(sum(r.service_s for r in m.requests))
    assert m.operating_point().device_seconds_per_call == pytest.approx(m.wall_s / 20)
    assert ms[1].requests_per_s == pytest.approx(4 * ms[0].requests_per_s, rel=0.15)
    assert set(m.by_kind) == set(KINDS)
    assert ms[2].tau == pytest.approx(2.5, rel=0.05)
    assert ms[2].operating_point().retrains and not m.operating_point().retrains


def test_older_schema_is_refused(tmp_path):
    import json

    from specledger.errors import BadInput
    from specledger.ledger.measurements import measurements_from_run

    run_dir = make_run(tmp_path, [Spec("ar-fp32", "ar")], n=4)
    data = json.loads((run_dir / "run.json").read_text())
    data["schema_version"] = 0
    (run_dir / "run.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match="schema_version"):
        measurements_from_run(run_dir)


def test_missing_device_time_names_the_field(tmp_path):
    import json

    from specledger.errors import BadInput
    from specledger.ledger.measurements import measurements_from_run

    run_dir = make_run(tmp_path, [Spec("ar-fp32", "ar")], n=4)
    data = json.loads((run_dir / "run.json").read_text())
    del data["configs"][0]["loads"][0]["aggregate"]["wall_s"]
    (run_dir / "run.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match=r"ar-fp32.*aggregate\.wall_s"):
        measurements_from_run(run_dir)


def test_not_a_run_directory(tmp_path):
    from specledger.errors import BadInput
    from specledger.ledger.measurements import measurements_from_run

    with pytest.raises(BadInput, match="run.json"):
        measurements_from_run(tmp_path)

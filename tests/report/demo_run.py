"""A synthetic run shaped like `make demo`'s: a graded "quality" level for each target (the speculative
configurations borrow their target's grading, being lossless), lossless and quantization gates, a machine, a
workload read from an absolute path and a run configuration. For the report's tests: the first screen names these,
and no absolute path of the machine shows."""

from __future__ import annotations

from pathlib import Path

from specledger.bench.metrics import aggregate
from specledger.records.config import QUALITY_LEVEL
from specledger.records.results import (
    CurvePoint, GateOutcome, LoadResult, RequestGrade, RequestLog, RequestRecord, WorkloadInfo, group_by, load_run, write_run,
)
from tests.ledger.test_ledger_fixtures import KINDS, Spec, make_run

SPECS = [Spec("ar-fp32", "ar", service_s=6.0, passes=8), Spec("ar-w4", "ar", quant="int4", service_s=4.0, passes=8),
         Spec("lookup-fp32", "lookup", service_s=4.5, passes=8, tau=1.6),
         Spec("lookup-w4", "lookup", quant="int4", service_s=3.4, passes=8, tau=1.5)]
GRADED = 40  # items of the graded level
TARGET = {"lookup-fp32": "ar-fp32", "lookup-w4": "ar-w4"}


def demo_run(root: Path, passes: dict[str, int] | None = None) -> Path:
    """The run directory; `passes`: graded items passed per target (default 30 of 40 each)."""
    passes = passes or {"ar-fp32": 30, "ar-w4": 29}
    run_dir = make_run(root, SPECS, n=8)
    run = load_run(run_dir)
    c = run.conditions
    c.cpu_model, c.cpu_count, c.torch_threads, c.torch, c.seed = "Test CPU 9000", 2, 2, "2.0", 0
    c.config = {"configs": [{"name": s.name, "max_tokens": 48, "sampling": {"temperature": 0.0}} for s in SPECS],
                "seed": 0}
    source = str(Path(root).resolve() / "data" / "prompts.jsonl")
    run.workload = WorkloadInfo(spec=source, format="spec-bench", chosen="first record", source=source, read=8,
                                questions=8, by_kind={k: 1 for k in KINDS}, with_reference={k: 1 for k in KINDS},
                                grading={k: "test grader" for k in KINDS})
    with RequestLog(run_dir) as log:
        for name, passed in passes.items():
            records = [RequestRecord(
                run_id="synthetic", config=name, request_id=f"{name}|{QUALITY_LEVEL}|{i}|t1", item=i,
                question_id=f"g{i}", category=KINDS[i % len(KINDS)], kind=KINDS[i % len(KINDS)], turn=1, turns=1,
                load=QUALITY_LEVEL, status="ok", output_tokens=20, arrival_t=0.0, start_t=0.0, first_token_t=0.1,
                end_t=1.0, ttft_s=0.1, e2e_s=1.0, grade=RequestGrade(passed=i < passed, grader="test"))
                for i in range(GRADED)]
            for r in records:
                log.append(r)
            cfg = run.config(name)
            assert cfg is not None
            cfg.loads.append(LoadResult(load=QUALITY_LEVEL, aggregate=aggregate(records, wall_s=40.0, resamples=0),
                                        by_kind={k: aggregate(v, resamples=0)
                                                 for k, v in group_by(records, "kind").items()}))
    for cfg in run.configs:
        cfg.quality_source = TARGET.get(cfg.name, cfg.name)
        # the target's verification-cost curve (drawn on a log2 axis)
        cfg.verify_curve = [CurvePoint(tokens=k, ms=10.0 + k * (0.5 if cfg.quant != "none" else 0.8)) for k in (1, 2, 4, 8, 16)]
        if cfg.name in TARGET:
            cfg.gates.append(GateOutcome(name="lossless", passed=True,
                                         reason=f"outputs identical to {TARGET[cfg.name]} on 8 of 8 prompts"))
        if cfg.quant != "none":
            cfg.gates.append(GateOutcome(name="quantization", passed=True,
                                         reason="top-1 agreement with fp32 97.4% (at least 95%)"))
    write_run(run_dir, run)
    return run_dir

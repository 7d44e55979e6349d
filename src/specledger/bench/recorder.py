"""A run directory as the run goes: what was measured, written so that an interruption loses nothing.

Each finished request is appended to requests.jsonl at once; run.json and summary.csv are rewritten after
every load level. On resume the records already there count: finished conversations are not repeated and
a level's aggregates pool the old and the new records.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console

from specledger.bench.backends.base import Completion
from specledger.records.config import BenchConfig, LoadLevel, RunConfig
from specledger.bench.env import collect_conditions
from specledger.bench.metrics import aggregate, spread_itl, tpot
from specledger.records.results import group_by
from specledger.records.results import (
    REQUESTS_FILE, ConfigResult, LoadResult, RequestGrade, RequestLog, RequestOutcome, RequestRecord, RunResult,
    WorkloadInfo, load_run, now, read_requests, repair_requests, write_run, write_summary,
)
from specledger.records.question import Question
from specledger.errors import BadInput, SpecLedgerError
from specledger.quality.graders import GradeResult
from specledger.quality.policy import apply_gates


class RunDirUnwritable(BadInput):
    """A write to the run directory failed mid-run: the run stops, what is on disk stays whole for --resume."""


class RunRecorder:
    def __init__(self, cfg: RunConfig, run_dir: Path, *, resume: bool, info: WorkloadInfo, energy_source: Any,
                 energy_available: bool, interleaved: bool, console: Console | None = None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.resume = resume
        self.segment = uuid.uuid4().hex[:8]
        self._t0_perf = time.perf_counter()
        self._t0_wall = time.time()
        self.log: RequestLog | None = None
        self._unwritable = False  # a write failed (the disk full, the directory read-only)
        if resume:
            self.result = load_run(run_dir)
            repaired = repair_requests(run_dir)  # before anything is appended after a torn record
            if repaired is not None:
                (console or Console(stderr=True)).print(f"[yellow]{repaired}[/yellow]", highlight=False, soft_wrap=True)
                self.note(repaired)
            self.result.status = "running"
            self.result.notes.append(f"resumed {now().isoformat(timespec='seconds')} (segment {self.segment})")
            self.previous = read_requests(run_dir)
            self._reopen_short_levels()
        else:
            if (run_dir / REQUESTS_FILE).exists():
                raise BadInput(f"{run_dir} already holds a run; resume it (--resume) or choose another run id")
            conditions = collect_conditions(cfg.model_dump(mode="json"), seed=cfg.seed, backends={},
                                            energy=energy_source,
                                            local_engine=any(c.backend == "inprocess" for c in cfg.configs))
            conditions.interleaved, conditions.order_seed = interleaved, cfg.seed if interleaved else None
            self.result = RunResult(run_id=run_dir.name, created=now(), conditions=conditions)
            if not energy_available:
                self.note("energy: unavailable (no RAPL powercap counters or NVML on this machine)")
            self.previous = []
        self.result.workload = info
        if info.timed and not cfg.load.replay:
            self.note("the workload's arrival times are not used at this load (replay them with load.replay / --replay)")

    def _reopen_short_levels(self) -> None:
        """A level run.json calls complete whose records are no longer all in requests.jsonl (its last one cut as
        torn, say) is measured again for what is missing rather than skipped with a request short."""
        for cr in self.result.configs:
            for lr in cr.loads:
                have = sum(r.config == cr.name and r.load == lr.load for r in self.previous)
                want = lr.aggregate.requests_ok + lr.aggregate.requests_failed
                if lr.complete and have < want:
                    lr.complete = False
                    self.note(f"{cr.name} {lr.load}: {want - have} of its {want} records are gone from "
                              f"{REQUESTS_FILE}: measured again")

    def open(self) -> None:
        """Create the run directory (or reopen it): a place that cannot be written is one line, before any request."""
        try:
            if not self.resume:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.save()
            self.log = RequestLog(self.run_dir)
        except OSError as exc:
            raise BadInput(f"cannot write the run directory {self.run_dir}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """Flush and write the run's files. After a failed write (a full disk) it tries once more and keeps quiet
        if that fails too: the first failure is the one said, and what is on disk is whole (durable writes)."""
        failed = self._unwritable
        try:
            if self.log is not None:
                log, self.log = self.log, None
                try:
                    log.sync()
                finally:
                    log.close()
            self.save()
        except OSError as exc:
            if not failed:
                raise self._unwritable_error(exc) from None
        except RunDirUnwritable:
            if not failed:
                raise

    def save(self) -> None:
        self.result.updated = now()
        try:
            write_run(self.run_dir, self.result)
            write_summary(self.run_dir, self.result)
        except OSError as exc:
            raise self._unwritable_error(exc) from None

    def _unwritable_error(self, exc: OSError | None) -> "RunDirUnwritable":
        self._unwritable = True
        why = f": {exc.strerror or exc}" if exc is not None else ""
        return RunDirUnwritable(f"cannot write the run directory {self.run_dir}{why}; what was measured before is "
                                f"kept: make room (or make it writable) and `specledger bench --resume "
                                f"{self.run_dir}` measures the rest")

    def note(self, text: str) -> None:
        if text not in self.result.notes:
            self.result.notes.append(text)

    def append(self, record: RequestRecord) -> None:
        assert self.log is not None, "open() the recorder first"
        try:
            self.log.append(record)  # (a failed write leaves no partial line: the record is measured again)
        except OSError as exc:
            raise self._unwritable_error(exc) from None

    def sync(self) -> None:
        if self.log is not None:
            try:
                self.log.sync()
            except OSError as exc:
                raise self._unwritable_error(exc) from None

    # ---- configurations and levels ----

    def config_result(self, bc: BenchConfig) -> ConfigResult:
        existing = self.result.config(bc.name)
        if existing is not None:
            return existing
        cr = ConfigResult(name=bc.name, backend=bc.backend, model=bc.model, strategy=bc.strategy, dtype=bc.dtype,
                          quant=bc.quant, group_size=bc.group_size if bc.quant == "int4" else None,
                          spec=bc.model_dump(mode="json"), quality_source=self.cfg.quality_source(bc))
        self.result.configs.append(cr)
        return cr

    def complete(self, bc: BenchConfig) -> set[str]:
        """The labels of bc's load levels already measured to the end."""
        cr = self.result.config(bc.name)
        return {lr.load for lr in cr.loads if lr.complete} if cr is not None else set()

    def skip(self, bc: BenchConfig, exc: SpecLedgerError, console: Console) -> None:
        """An optional configuration that cannot start: say so, drop its (empty) results, run the rest."""
        note = f"skipped {bc.name}: {str(exc).removeprefix(f'configuration {bc.name!r}: ')}"
        self.result.notes.append(note)
        self.result.configs = [c for c in self.result.configs if c.name != bc.name]
        console.print(f"[yellow]{note}[/yellow]")
        self.save()

    def done_items(self, bc: BenchConfig, label: str) -> set[int]:
        """Items of a level whose every turn was recorded ok in an earlier segment."""
        turns: dict[int, set[int]] = defaultdict(set)
        needed: dict[int, int] = {}
        for r in self.previous:
            if r.config == bc.name and r.load == label and r.status == "ok":
                turns[r.item].add(r.turn)
                needed[r.item] = r.turns
        return {i for i, t in turns.items() if len(t) >= needed[i]}

    def single_segment(self, bc: BenchConfig, label: str, done: set[int]) -> bool:
        """Whether this segment measures the whole level (energy and telemetry deltas then cover it)."""
        return not done and not any(r.config == bc.name and r.load == label for r in self.previous)

    def finish_level(self, bc: BenchConfig, lr: LoadResult) -> None:
        """A level's results in sweep order, the gates again, everything written."""
        lr.complete = True
        cr = self.config_result(bc)
        cr.loads = [x for x in cr.loads if x.load != lr.load] + [lr]
        order = [lv.label for lv in self.cfg.load.levels()]
        cr.loads.sort(key=lambda x: order.index(x.load) if x.load in order else len(order))
        apply_gates(self.result, read_requests(self.run_dir), self.cfg)
        self.save()

    def load_result(self, bc: BenchConfig, level: LoadLevel, records: list[RequestRecord], *,
                    energy: float | None, started: Any, interleaved: bool = False) -> LoadResult:
        """Aggregates of one configuration at one level, over this segment's and earlier segments' records.
        Interleaved: its device time is the time its own requests were in service (the other configurations'
        requests ran in between)."""
        recs = list({r.request_id: r for r in [*self.previous, *records]  # a request measured again: its last record
                     if r.config == bc.name and r.load == level.label}.values())
        by_segment = group_by(recs, "segment")
        wall = None if interleaved else sum(max(r.end_t for r in rs) - min(r.arrival_t for r in rs)
                                            for rs in by_segment.values())
        b, seed, slo = self.cfg.bootstrap, self.cfg.seed, self.cfg.slo
        lr = LoadResult(
            load=level.label, concurrency=level.concurrency, rate=level.rate, replay=level.replay, started=started,
            aggregate=aggregate(recs, wall_s=wall, energy_j=energy, slo=slo, resamples=b, seed=seed),
            segments=len(by_segment),
        )
        small = b // 5
        lr.by_category = {k: aggregate(v, slo=slo, resamples=small, seed=seed)
                          for k, v in group_by(recs, "category").items()}
        lr.by_kind = {k: aggregate(v, slo=slo, resamples=small, seed=seed) for k, v in group_by(recs, "kind").items()}
        return lr

    # ---- one request ----

    def _wall(self, t: float) -> float:
        return self._t0_wall + (t - self._t0_perf)

    def record(self, bc: BenchConfig, q: Question, c: Completion, *, item: int, turn: int, arrival: float,
               level: LoadLevel, grade: GradeResult | None) -> RequestRecord:
        ttft = (c.first_token - arrival) if c.first_token is not None else None
        e2e = c.end - arrival
        disagree = (c.usage_output_tokens is not None and c.tokenizer_output_tokens is not None
                    and c.usage_output_tokens != c.tokenizer_output_tokens)
        outcome = {name: getattr(c, name) for name in RequestOutcome.model_fields}  # the telemetry too
        outcome.update(error_kind=None if c.ok else (c.error_kind or "other"), output_tokens=c.output_tokens if c.ok else 0)
        return RequestRecord(
            **outcome, run_id=self.result.run_id, config=bc.name,
            request_id=f"{bc.name}|{level.label}|{item}|t{turn}", item=item,
            question_id=q.question_id, category=q.category, kind=q.kind, turn=turn, turns=len(q.turns),
            load=level.label, concurrency=level.concurrency, rate=level.rate, segment=self.segment,
            status="ok" if c.ok else "failed", usage_disagrees=disagree,
            arrival_t=self._wall(arrival), start_t=self._wall(c.start),
            first_token_t=self._wall(c.first_token) if c.first_token is not None else None,
            end_t=self._wall(c.end), queue_s=max(0.0, c.start - arrival),
            ttft_s=ttft if c.ok else None, e2e_s=e2e if c.ok else None,
            tpot_s=tpot(e2e, ttft, c.output_tokens) if c.ok else None,
            itl_s=spread_itl(c.chunks) if c.ok else [],
            output_text=c.text, output_token_ids=c.token_ids,
            grade=None if grade is None else RequestGrade(passed=grade.passed, score=grade.score,
                                                          grader=grade.grader, detail=grade.detail,
                                                          outcome=grade.outcome),
        )

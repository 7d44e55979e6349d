"""What a benchmark run leaves on disk: the single definition, read by the ledger and the reports.

A run directory holds
  requests.jsonl  one RequestRecord per request per turn, appended and flushed as each finishes;
  run.json        RunResult: conditions, per configuration and load level aggregates, quality gates;
  summary.csv     one row per configuration x load level (SUMMARY_COLUMNS).
Times in records are wall-clock epoch seconds (so segments of a resumed run line up); durations
are seconds measured with perf_counter.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specledger.errors import BadInput, describe
from specledger.records import durable
from specledger.spec_stats import LevelStats

SCHEMA_VERSION = 1
REQUESTS_FILE = "requests.jsonl"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.csv"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RequestGrade(_Model):
    passed: bool | None
    score: float | None = None
    grader: str = ""
    detail: str = ""
    outcome: str | None = None  # code tasks: passed, failed, error or timeout (quality/execute.py)


class EngineTelemetry(_Model):
    """What the serving side reported about a request beyond its text: speculation statistics,
    phase times, memory, energy. A backend's Completion and the RequestRecord on disk share it."""

    steps: int | None = None  # target forward passes
    tau: float | None = None
    levels: list[LevelStats] = Field(default_factory=list)
    draft_s: float | None = None
    verify_s: float | None = None
    prefill_s: float | None = None
    draft_prefill_s: float | None = None
    cached_prompt_tokens: int | None = None  # prompt tokens the server found in its prefix cache (not prefilled)
    peak_rss_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    energy_j: float | None = None
    extra: dict[str, Any] = Field(default_factory=dict)  # backend telemetry as received (e.g. llama.cpp timings)


class RequestOutcome(EngineTelemetry):
    """How a request ended: what a backend's Completion says and the RequestRecord on disk keeps."""

    error: str | None = None
    error_kind: str | None = None  # failed requests: "dropped", "http_500", "timeout", ... (counted per level)
    attempts: int = 1  # retries = attempts - 1
    # Sent again on a fresh connection because the connection failed before any byte of a response arrived
    # (a stale keep-alive connection the server had closed, or a refused connect): never a failure by itself.
    transport_retries: int = 0
    transport_errors: list[str] = Field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    usage_output_tokens: int | None = None  # as the server reported it
    tokenizer_output_tokens: int | None = None  # as our tokenizer counted the text


class Attempt(_Model):
    """One attempt at a graded task under a retry policy (attempt 1 is the record's own answer)."""

    k: int
    passed: bool | None
    outcome: str | None = None  # the grade's outcome (code: passed, failed, error, timeout); "request failed"
    detail: str = ""
    device_s: float | None = None  # the request's service time (end - start, queueing excluded)
    prompt_tokens: int = 0
    output_tokens: int = 0
    temperature: float = 0.0
    seed: int | None = None


class RequestRecord(RequestOutcome):
    """One request (one turn of one conversation) as measured."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    config: str
    request_id: str  # f"{config}|{load}|{item}|t{turn}": unique within a run
    item: int  # position in the level's request sequence (the workload cycles when it is shorter)
    question_id: str
    category: str
    kind: str
    turn: int  # 1-based
    turns: int  # turns in the conversation
    load: str  # "c=4" (closed loop) or "r=2.5" (open loop, requests/s)
    concurrency: int | None = None
    rate: float | None = None
    segment: str = ""  # the process that measured it (a resumed run has several)
    repeat: int = 0  # pass over the workload (RunConfig.repeats); item = repeat x items per pass + position
    block: int | None = None  # interleaved runs: the block (one item under every configuration) it ran in
    slot: int | None = None  # its position within that block's seeded random order
    status: Literal["ok", "failed"]
    usage_disagrees: bool = False

    arrival_t: float  # request became due (open loop: its Poisson arrival)
    start_t: float | None = None  # sent / taken off the queue
    first_token_t: float | None = None
    end_t: float
    queue_s: float = 0.0
    ttft_s: float | None = None  # from arrival, queueing included
    e2e_s: float | None = None  # from arrival
    tpot_s: float | None = None
    itl_s: list[float] = Field(default_factory=list)

    output_text: str = ""
    output_token_ids: list[int] | None = None
    grade: RequestGrade | None = None
    task_attempts: list[Attempt] = Field(default_factory=list)  # a retry loop's attempts, the first included


class Dist(_Model):
    """Distribution of one latency over requests (or tokens, for ITL) with bootstrap 95% CIs."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    ci: dict[str, tuple[float, float]] = Field(default_factory=dict)  # stat name -> (low, high)


class Aggregate(_Model):
    requests_ok: int = 0
    requests_failed: int = 0
    errors: dict[str, int] = Field(default_factory=dict)  # failed requests by error kind
    retries: int = 0
    transport_retries: int = 0  # stale/refused connections re-sent at once (not failures)
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: Dist = Field(default_factory=Dist)
    tpot: Dist = Field(default_factory=Dist)
    itl: Dist = Field(default_factory=Dist)
    e2e: Dist = Field(default_factory=Dist)
    queue: Dist = Field(default_factory=Dist)
    request_tok_s: Dist = Field(default_factory=Dist)  # per request: output tokens / e2e
    wall_s: float = 0.0  # measurement phase: the device-seconds these requests occupied
    output_tok_s: float | None = None  # output tokens / wall_s
    requests_s: float | None = None
    goodput_rps: float | None = None  # requests/s meeting every SLO given
    slo_met: int | None = None
    steps: int | None = None
    tau: float | None = None  # output tokens / target steps, over requests that report steps
    acceptance: list[LevelStats] = Field(default_factory=list)
    draft_s: float | None = None
    verify_s: float | None = None
    energy_j: float | None = None
    energy_j_per_token: float | None = None
    peak_rss_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    usage_disagreements: int = 0
    graded: int = 0
    passed: int = 0


class ConditionSample(_Model):
    """The machine's conditions at t seconds into a level (None: not readable here)."""

    t: float
    cpu_mhz: float | None = None
    cpu_temp_c: float | None = None  # the hottest sensor psutil reports
    gpu_temp_c: float | None = None
    gpu_sm_mhz: float | None = None
    gpu_throttle: int | None = None  # NVML's clock throttle reasons (a bit mask; 0: none)


class SteadyState(_Model):
    """Throughput by windows of `window` completed conversations through a level (bench/steady.py)."""

    window: int  # completed requests per window
    tolerance: float
    reached: bool
    windows_tok_s: list[float]
    span: int = 2  # windows the slope is fitted over
    windows_req_s: list[float] = Field(default_factory=list)
    window_ends_s: list[float] = Field(default_factory=list)  # seconds from the level's start
    duration_s: float | None = None  # the --sustain limit the level ran under
    burst_tok_s: float | None = None  # the first window
    steady_tok_s: float | None = None  # the mean of the last `span` windows, once steady
    steady_req_s: float | None = None
    time_to_steady_s: float | None = None
    steady_j_per_request: float | None = None  # energy per request in the steady windows
    samples: list[ConditionSample] = Field(default_factory=list)


class LoadResult(_Model):
    load: str
    concurrency: int | None = None
    rate: float | None = None
    replay: float | None = None  # trace replay at this speed factor
    started: datetime | None = None
    aggregate: Aggregate
    by_category: dict[str, Aggregate] = Field(default_factory=dict)
    by_kind: dict[str, Aggregate] = Field(default_factory=dict)
    telemetry: dict[str, Any] | None = None  # server counters (before/after deltas), normalised
    telemetry_levels: list[LevelStats] = Field(default_factory=list)
    steady_state: SteadyState | None = None
    complete: bool = False  # every request of the level was issued (resume skips complete levels)
    segments: int = 1  # processes that measured it (a resumed level has more than one)


class CurvePoint(_Model):
    """One forward pass over `tokens` new tokens on top of a cached context took `ms`."""

    tokens: int
    ms: float


class GateOutcome(_Model):
    name: str
    passed: bool | None  # None: not checked (reason says why)
    reason: str = ""
    figures: dict[str, Any] = Field(default_factory=dict)


class ConfigResult(_Model):
    name: str
    backend: str
    model: str
    strategy: str
    dtype: str | None = None
    quant: str | None = None
    group_size: int | None = None
    spec: dict[str, Any] = Field(default_factory=dict)  # the configuration as resolved
    loads: list[LoadResult] = Field(default_factory=list)
    gates: list[GateOutcome] = Field(default_factory=list)
    pass_rate: float | None = None
    # the configuration whose graded "quality" level stands for this one's quality: itself, or the greedy
    # autoregressive configuration of the same target and precision (lossless speculation: the same outputs)
    quality_source: str | None = None
    pass_ci: tuple[float, float] | None = None
    comparable: bool = True
    comparable_reason: str = ""
    # measured once per target model (bench/probes.py): forward ms for n new tokens; agreement with fp32
    verify_curve: list[CurvePoint] = Field(default_factory=list)
    agreement: dict[str, Any] | None = None


class Conditions(_Model):
    python: str
    torch: str | None = None
    specledger: str
    platform: str
    cpu_model: str | None = None
    cpu_count: int | None = None
    gpu: str | None = None
    torch_threads: int | None = None
    kernel: str | None = None  # the CPU product path of in-process engines (engine/qkernel.py describe)
    seed: int = 0
    backends: dict[str, str] = Field(default_factory=dict)  # backend name -> version/description
    energy: str = "unavailable"  # "rapl", "nvml", "rapl+nvml" or "unavailable"
    config: dict[str, Any] = Field(default_factory=dict)  # the run configuration as resolved
    interleaved: bool = False  # configurations ran request by request in seeded random block order
    order_seed: int | None = None  # the seed of that order


class NoiseProbe(_Model):
    """One calibration probe: a fixed matrix product, timed, and the machine's load at that moment."""

    when: str  # "before", "during", "after"
    ms: float  # median time of the fixed product, once warm (bench/calibration.py settled_ms)
    first_round_ms: float | None = None  # its first timed round (after the untimed warm-up): how cold it still was
    load_avg: list[float] | None = None  # os.getloadavg(): 1, 5, 15 minutes (counts this run's own threads too)
    # CPU counters (bench/calibration.py cpu_counters): seconds on a clock shared by processes, the machine's busy
    # CPU seconds, this process tree's CPU seconds; from two probes, what other processes took in between
    clock_s: float | None = None
    busy_cpu_s: float | None = None
    own_cpu_s: float | None = None
    others_cores: float | None = None  # other processes' mean CPU use (cores) since the previous probe


class ThreadProbe(_Model):
    """One model's forward of `tokens` new tokens at `threads` torch threads (median ms)."""

    model: str
    tokens: int
    threads: int
    ms: float


class ThreadChoice(_Model):
    """torch's thread count for the run's in-process work and how it was decided (bench/threads.py)."""

    threads: int
    source: Literal["given", "probe", "unchanged"]
    candidates: list[int] = Field(default_factory=list)
    probes: list[ThreadProbe] = Field(default_factory=list)
    relative: dict[str, float] = Field(default_factory=dict)  # threads -> time relative to 1 thread (geo. mean)
    probe_s: float | None = None
    note: str = ""


class Noise(_Model):
    """How steady the machine was during the run (bench/calibration.py)."""

    probes: list[NoiseProbe] = Field(default_factory=list)
    threads: dict[str, Any] = Field(default_factory=dict)  # torch threads, *_NUM_THREADS variables, cpu count
    thread_choice: ThreadChoice | None = None  # how the torch thread count was decided
    drift: float | None = None  # (slowest - fastest probe) / fastest
    warning: str | None = None  # set when drift or load passes the thresholds, naming the cause


class WorkloadInfo(_Model):
    """What the workload was: its format and how it was chosen, what was read, selected and skipped (per task
    kind), and how each kind is graded (the runner fills `grading`)."""

    spec: str
    format: str
    chosen: str = ""  # "named" or what the detection looked at
    source: str | None = None
    read: int = 0  # valid records read before selection
    complete: bool = True  # the whole file was read (False: --limit stopped the read early)
    selection: str = "all"
    questions: int = 0
    by_kind: dict[str, int] = Field(default_factory=dict)
    with_reference: dict[str, int] = Field(default_factory=dict)  # questions that carry a reference, per kind
    skipped: dict[str, int] = Field(default_factory=dict)  # kind ("unreadable": not a record at all) -> lines
    skipped_examples: list[str] = Field(default_factory=list)
    timed: bool = False  # questions carry arrival times (a trace): replayable
    grading: dict[str, str] = Field(default_factory=dict)  # kind -> how it is graded


class RunResult(_Model):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    created: datetime
    updated: datetime | None = None
    status: Literal["running", "complete", "interrupted", "failed"] = "running"
    # the decision `compare` reached on this run (ledger/answer.py's Answer as JSON; the ledger imports bench,
    # not the other way round); also in ledger.json with the whole ledger
    answer: dict[str, Any] | None = None
    conditions: Conditions
    configs: list[ConfigResult] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    workload: WorkloadInfo | None = None
    noise: Noise | None = None

    def config(self, name: str) -> ConfigResult | None:
        return next((c for c in self.configs if c.name == name), None)


def now() -> datetime:
    return datetime.now(timezone.utc)


# ---- reading and writing -------------------------------------------------------------


class RequestLog:
    """Append-only requests.jsonl, crash-consistent: each record goes out as one O_APPEND write of the whole
    line (a loop only where the kernel writes less), so a kill at any byte tears at most the last record, and
    a write that fails (disk full) is cut back so that no partial line is left for the next record to follow.
    Records reach the OS at once (a crash of the process loses nothing); sync() (called at the end of each
    load level) also survives a crash of the OS without paying an fsync per record."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / REQUESTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: RequestRecord) -> None:
        line = (record.model_dump_json() + "\n").encode("utf-8")
        start = os.fstat(self._fd).st_size
        try:
            _write_all(self._fd, line)
        except OSError:
            os.ftruncate(self._fd, start)
            raise

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "RequestLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    """One write of the whole line; the rest again only where the kernel took less."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _parse_record(line: bytes) -> RequestRecord | None:
    try:
        return RequestRecord.model_validate_json(line)
    except ValidationError:
        return None


def repair_requests(run_dir: str | Path) -> str | None:
    """Before a resume appends: cut requests.jsonl back to its last complete record, so that the next record
    does not land on a line torn by a kill. Returns what was done, in a line (None: nothing to do)."""
    path = Path(run_dir) / REQUESTS_FILE
    if not path.exists():
        return None
    data = path.read_bytes()
    body = data[:-1] if data.endswith(b"\n") else data
    start = body.rfind(b"\n") + 1  # where the last line begins
    if not body[start:] or _parse_record(body[start:]) is not None:
        if body[start:] and body is data:  # the kill fell just before the newline: a whole record, kept
            with open(path, "ab") as f:
                f.write(b"\n")
        return None
    with open(path, "rb+") as f:
        f.truncate(start)
    line = body.count(b"\n") + 1
    return (f"{path}:{line}: cut a torn last record ({len(data) - start} bytes, an interrupted write) before "
            "resuming; its request runs again")


def _after_torn(line: bytes) -> RequestRecord | None:
    """The whole record after a torn one on the same line (what resuming after a kill appended before
    repair_requests), or None."""
    start = line.rfind(b'{"' + next(iter(RequestRecord.model_fields)).encode() + b'":')
    return _parse_record(line[start:]) if start > 0 else None


_warned: set[tuple[str, int]] = set()


def _warn_torn(path: Path, line: int, size: int) -> None:
    """Once per file and state: a reader goes on without the torn last record, saying so on stderr."""
    if (str(path), size) not in _warned:
        _warned.add((str(path), size))
        print(f"warning: {path}:{line}: torn last record (an interrupted write), ignored", file=sys.stderr)


def read_requests(run_dir: str | Path, *, latest_only: bool = True) -> list[RequestRecord]:
    """Records of a run; with latest_only a request measured again (resume) keeps its last record.

    A torn last line (a kill mid-write) is ignored with a warning on stderr, and so is a torn record that a whole
    one follows on the same line (written by a resume from before repair_requests); any other bad line is an error
    naming it.
    """
    path = Path(run_dir) / REQUESTS_FILE
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    if not lines[-1]:
        lines.pop()
    records: list[RequestRecord] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(RequestRecord.model_validate_json(line))
        except ValidationError as exc:
            if i == len(lines):
                _warn_torn(path, i, len(data))
                break
            whole = _after_torn(line)
            if whole is not None:
                records.append(whole)
                print(f"warning: {path}:{i}: a torn record, then a whole one on the same line (an older specledger "
                      "resumed after a kill without cutting it): read the whole one", file=sys.stderr)
                continue
            raise BadInput(f"{path}:{i}: not a request record ({describe(exc)})") from None
    if latest_only:  # each request at the place of its last record
        last = {r.request_id: i for i, r in enumerate(records)}
        records = [r for i, r in enumerate(records) if last[r.request_id] == i]
    return records


def write_run(run_dir: str | Path, run: RunResult) -> Path:
    """Replace run.json whole, a crash of the OS included (records/durable.py)."""
    return durable.write_text(Path(run_dir) / RUN_FILE, run.model_dump_json(indent=2))


def load_run(run_dir: str | Path) -> RunResult:
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        raise BadInput(f"{run_dir}: no {RUN_FILE} (not a specledger run directory)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not valid JSON (line {exc.lineno})") from None
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BadInput(f"{path}: schema_version {version!r}, this specledger reads {SCHEMA_VERSION}")
    try:
        return RunResult.model_validate(data)
    except ValidationError as exc:
        raise BadInput(f"{path}: {describe(exc)}") from None


_LATENCY_COLUMNS = [f"{m}_{s}" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p95", "p99")]
SUMMARY_COLUMNS = [
    "run_id", "config", "backend", "model", "strategy", "dtype", "quant", "load", "concurrency", "rate",
    "requests_ok", "requests_failed", "failure_rate", "error_kinds", "retries", "transport_retries",
    "output_tokens", "wall_s", *_LATENCY_COLUMNS, "queue_mean", "output_tok_s", "requests_s", "goodput_rps", "tau", "acceptance",
    "energy_j", "energy_j_per_token", "peak_rss_bytes", "cuda_max_allocated_bytes",
    "pass_rate", "comparable", "comparable_reason",
]


def failure_rate(a: Aggregate) -> float | None:
    n = a.requests_ok + a.requests_failed
    return a.requests_failed / n if n else None


def error_kinds(a: Aggregate) -> str:
    """"dropped=2;http_500=1": failed requests by kind, most frequent first."""
    return ";".join(f"{k}={n}" for k, n in sorted(a.errors.items(), key=lambda kv: (-kv[1], kv[0])))


def summary_rows(run: RunResult) -> Iterable[dict[str, Any]]:
    for c in run.configs:
        for lr in c.loads:
            a = lr.aggregate
            # the columns named as a field of the configuration, the level or its aggregate, then the derived ones
            row: dict[str, Any] = {k: getattr(src, k) for src in (c, lr, a) for k in SUMMARY_COLUMNS
                                   if k in type(src).model_fields}
            row |= {"run_id": run.run_id, "config": c.name, "failure_rate": failure_rate(a),
                    "error_kinds": error_kinds(a), "queue_mean": a.queue.mean,
                    "acceptance": ";".join(f"{x.name}={x.rate:.4f}" for x in a.acceptance if x.rate is not None)}
            row |= {f"{m}_{s}": getattr(getattr(a, m), s) for m, s in (c.split("_") for c in _LATENCY_COLUMNS)}
            yield row


def write_summary(run_dir: str | Path, run: RunResult) -> Path:
    path = Path(run_dir) / SUMMARY_FILE
    with durable.replacing(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        w.writeheader()
        w.writerows({k: "" if v is None else v for k, v in row.items()} for row in summary_rows(run))
    return path


# Relative 1-sigma spread of each method, carried into the ledger's intervals. Counters: software power models
# with ~10-15% reported error (RAPL) and ~5% (NVML's board counter); the estimate: a TDP share can be off by half.
METHOD_SPREAD = {"rapl": 0.12, "nvml": 0.05, "rapl+nvml": 0.12, "estimated": 0.5}


def group_by(records: Iterable[RequestRecord], key: str) -> dict[str, list[RequestRecord]]:
    """Records by one of their fields (configuration, load), in sorted order so every table reads alike."""
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[getattr(r, key)].append(r)
    return dict(sorted(out.items()))


def kind_passes(run: RunResult, kind: str) -> str:
    """"config passed/graded" for one task kind at each configuration's first load level (graded kinds only)."""
    return ", ".join(f"{c.name} {a.passed}/{a.graded}" for c in run.configs
                     if c.loads and (a := c.loads[0].by_kind.get(kind)) is not None and a.graded)


def thread_choice_text(c: ThreadChoice) -> str:
    """One line: the count and why."""
    if c.source == "given":
        return f"{c.threads} (given)"
    if c.source == "unchanged":
        return f"{c.threads} (torch's default: {c.note})"
    rel = ", ".join(f"{t} → {r:.2f}x" for t, r in c.relative.items())
    return f"{c.threads} (chosen by a {c.probe_s:.1f} s probe; step time vs 1 thread: {rel})"

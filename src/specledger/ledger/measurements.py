"""What the ledger needs from a benchmark run, per configuration and load level.

The harness's results directory (records/results.py) is read once here; everything downstream
works on ConfigMeasurement, so the ledger can also price measurements from elsewhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specledger.records.config import QUALITY_LEVEL
from specledger.records.results import METHOD_SPREAD
from specledger.records.results import CurvePoint
from specledger.records.config import result_arm
from specledger.records.pairing import Arm, baselines
from specledger.errors import BadInput
from specledger.ledger.attempts import AttemptStats, run_attempts
from specledger.ledger.cost_model import TRAINED_DRAFTERS, OperatingPoint


class RequestPoint(BaseModel):
    """One completed request, kept for the bootstrap and the latency distributions."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    service_s: float | None = None  # e2e minus queueing: the time it occupied the device
    output_tokens: int = 0
    key: str = ""  # the prompt (question|turn|repeat): pairs it with the same prompt under another configuration
    prompt_tokens: int | None = None  # as the backend counted them: TTFT against input length (report/charts.py)


class KindMeasurement(BaseModel):
    requests: int = 0
    tok_s: float | None = None
    tau: float | None = None
    passes: float = 0  # as ConfigMeasurement's: graded items, each once
    graded: int = 0


class ConfigMeasurement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    strategy: str
    model: str = ""
    backend: str = ""
    precision: str = ""
    where: str = ""  # the device, the server's URL, or "managed:<engine>" (records/pairing.py)
    sampling: str = ""  # "greedy", or the distribution sampled from (records/pairing.py)
    load: str = "c=1"
    concurrency: int | None = None
    rate: float | None = None
    requests_completed: int
    requests_failed: int = 0
    errors: dict[str, int] = Field(default_factory=dict)  # failed requests by kind ("dropped", "http_500", ...)
    wall_s: float  # measurement phase
    device_count: int = 1
    output_tokens: int
    tok_s: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    tpot_p50: float | None = None
    tpot_p95: float | None = None
    e2e_p50: float | None = None
    e2e_p95: float | None = None
    # a summary-only import may have a p99 and no p95: the p99 bounds the p95 from above (objectives use it)
    ttft_p99: float | None = None
    tpot_p99: float | None = None
    e2e_p99: float | None = None
    requests: list[RequestPoint] = Field(default_factory=list)
    tau: float | None = None
    # Graded items, each counted once however many times it was asked (--repeats): an item passes by the share
    # of its answers that passed (greedy repeats are copies: 0 or 1), so repeats never inflate n.
    passes: float = 0
    graded: int = 0  # graded items + failed requests (each a failed attempt), when anything was graded
    comparable: bool = True
    comparable_reason: str = ""
    energy_j: float | None = None  # measurement phase, all devices
    energy_method: str = "unavailable"  # how energy_j was had (bench/energy.py METHOD_SPREAD's keys)
    # a level held until steady (--sustain): requests/s and joules per request in its steady windows, which the
    # ledger prices instead of the whole level's (burst included); None: not held, or it never settled
    steady_req_s: float | None = None
    steady_j_per_request: float | None = None
    by_kind: dict[str, KindMeasurement] = Field(default_factory=dict)
    verify_curve: list[CurvePoint] = Field(default_factory=list)
    grades: dict[str, float] = Field(default_factory=dict)  # graded item (question id) -> share of its answers passed
    grades_from: str = ""  # whose graded answers `grades` are: this configuration's, or (lossless speculation) the
    # autoregressive configuration of its target and precision, whose graded quality level stands for it
    outputs: str | None = None  # digest of every output: equal digests, equal outputs (and equal quality)
    retry: AttemptStats | None = None  # the measured retry loop (ledger/attempts.py); None: the formula prices it

    @property
    def requests_per_s(self) -> float:
        return self.requests_completed / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def pass_rate(self) -> float | None:
        return self.passes / self.graded if self.graded else None

    @property
    def label(self) -> str:
        return f"{self.name} @{self.load}"

    @property
    def arm(self) -> Arm:
        return Arm(self.name, self.strategy, self.backend, self.where, self.model, self.precision, self.sampling)

    def operating_point(self, device_count: int | None = None) -> OperatingPoint:
        """The numbers the cost model prices; device_count overrides what the run recorded."""
        if self.requests_completed <= 0 or self.wall_s <= 0:
            raise BadInput(f"{self.label}: no completed requests to price (requests_completed={self.requests_completed})")
        n = device_count or self.device_count
        per_call = 1.0 / self.steady_req_s if self.steady_req_s else self.wall_s / self.requests_completed
        energy = self.steady_j_per_request if self.steady_req_s and self.steady_j_per_request is not None else (
            None if self.energy_j is None else self.energy_j / self.requests_completed)
        return OperatingPoint(
            device_seconds_per_call=per_call * n,
            output_tokens_per_call=self.output_tokens / self.requests_completed,
            pass_rate=self.pass_rate,
            requests_per_s=self.steady_req_s or self.requests_per_s,
            device_count=n,
            energy_j_per_call=energy,
            energy_spread=METHOD_SPREAD.get(self.energy_method.split(":")[0].split(" ")[0], 0.0),
            ttft_p95=self.ttft_p95 if self.ttft_p95 is not None else self.ttft_p99,
            tpot_p95=self.tpot_p95 if self.tpot_p95 is not None else self.tpot_p99,
            e2e_p95=self.e2e_p95 if self.e2e_p95 is not None else self.e2e_p99,
            p95_from_p99=tuple(k for k in ("ttft", "tpot", "e2e")
                               if getattr(self, f"{k}_p95") is None and getattr(self, f"{k}_p99") is not None),
            e2e_p50=self.e2e_p50,
            retrains=self.strategy in TRAINED_DRAFTERS,
            attempts=self.retry.attempt_equivalents if self.retry else None,
            escalation=self.retry.escalation if self.retry else None,
        )


def measurement_baselines(ms: Iterable[ConfigMeasurement]) -> dict[str, str]:
    """Configuration name -> its autoregressive baseline's (records/pairing.py), over measurements of any levels."""
    return baselines(m.arm for m in ms)


def _attempts_judged(graded: int, failed: int) -> int:
    """The pass rate's denominator: graded answers plus failed requests (a failed request is a failed
    attempt, so failing never makes a configuration cheaper). Nothing graded: no measured pass rate."""
    return graded + failed if graded else 0


def measurements_from_run(run_dir: str | Path) -> list[ConfigMeasurement]:
    """One ConfigMeasurement per configuration x load level of a harness results directory."""
    from specledger.records.results import RUN_FILE, load_run, read_requests

    run_dir = Path(run_dir)
    run = load_run(run_dir)
    energy_method = run.conditions.energy
    raw = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    raw_configs = {c.get("name"): c for c in raw.get("configs", []) if isinstance(c, dict)}
    records = [r for r in read_requests(run_dir) if r.status == "ok"]
    quality = _quality_grades(records)
    loops = run_attempts(records, {c.name: c.quality_source for c in run.configs})
    out: list[ConfigMeasurement] = []
    for ci, c in enumerate(run.configs):
        extra = raw_configs.get(c.name, {})
        curve = [CurvePoint(**p) for p in (extra.get("verify_curve") or c.spec.get("verify_curve") or [])]
        device_count = int(extra.get("device_count") or c.spec.get("device_count") or 1)
        graded = quality.get(c.quality_source or "")  # the graded quality level stands for its pass rate
        arm = result_arm(c)
        for li, lr in enumerate(c.loads):
            if lr.load == QUALITY_LEVEL:
                continue
            a = lr.aggregate
            where = f"{run_dir / RUN_FILE}: configs[{ci}] ({c.name}).loads[{li}] ({lr.load}).aggregate"
            if a.requests_ok > 0 and a.wall_s <= 0:
                raise BadInput(f"{where}.wall_s: missing or 0; the ledger needs the device time of the measurement phase")
            mine = [r for r in records if r.config == c.name and r.load == lr.load]
            grades = graded if graded is not None else item_grades(mine)
            kind_grades = {k: item_grades([r for r in mine if r.kind == k]) for k in lr.by_kind}
            reqs = [RequestPoint(ttft_s=r.ttft_s, tpot_s=r.tpot_s, e2e_s=r.e2e_s, output_tokens=r.output_tokens,
                                 service_s=None if r.e2e_s is None else max(r.e2e_s - r.queue_s, 0.0),
                                 key=f"{r.question_id}|t{r.turn}|r{r.repeat}", prompt_tokens=r.prompt_tokens)
                    for r in mine]
            ss = lr.steady_state
            out.append(ConfigMeasurement(
                **{k: getattr(c, k) for k in ("name", "strategy", "model", "backend", "comparable", "comparable_reason")},
                **{k: getattr(arm, k) for k in ("precision", "where", "sampling")},
                **{k: getattr(lr, k) for k in ("load", "concurrency", "rate")},
                **{k: getattr(a, k) for k in ("errors", "wall_s", "output_tokens", "tau", "energy_j")},
                **{f"{lat}_{p}": getattr(getattr(a, lat), p) for lat in ("ttft", "tpot", "e2e") for p in ("p50", "p95", "p99")},
                requests_completed=a.requests_ok, requests_failed=a.requests_failed, device_count=device_count,
                tok_s=a.output_tok_s, requests=reqs, passes=sum(grades.values()),
                graded=_attempts_judged(len(grades), a.requests_failed), energy_method=energy_method,
                steady_req_s=ss.steady_req_s if ss else None, steady_j_per_request=ss.steady_j_per_request if ss else None,
                by_kind={k: KindMeasurement(requests=g.requests_ok, tok_s=g.output_tok_s, tau=g.tau,
                                            passes=sum(kind_grades.get(k, {}).values()),
                                            graded=_attempts_judged(len(kind_grades.get(k, {})), g.requests_failed))
                         for k, g in lr.by_kind.items()},
                verify_curve=curve, grades=grades, outputs=_digest(mine), retry=loops.get(c.name),
                grades_from=(c.quality_source or c.name) if graded is not None else c.name))
    if not out:
        raise BadInput(f"{run_dir / RUN_FILE}: no configuration with a measured load level")
    return out


def item_grades(records) -> dict[str, float]:
    """Question -> share of its graded answers that passed. Each item counts once: repeats of a question
    (--repeats) are more answers to the same item, not more items (greedy ones are copies), so they never
    inflate the n behind a pass rate's interval. Multi-turn questions are graded on their last turn."""
    seen: dict[str, list[bool]] = {}
    for r in records:
        if r.turn == r.turns and r.grade is not None and r.grade.passed is not None:
            seen.setdefault(r.question_id, []).append(bool(r.grade.passed))
    return {q: sum(v) / len(v) for q, v in seen.items()}


def _quality_grades(records) -> dict[str, dict[str, float]]:
    """Configuration -> its graded quality level (question -> share passed)."""
    by_config: dict[str, list] = {}
    for r in records:
        if r.load == QUALITY_LEVEL:
            by_config.setdefault(r.config, []).append(r)
    return {c: g for c, rs in by_config.items() if (g := item_grades(rs))}


def _digest(records) -> str | None:
    """Hash of every output (token ids where known, else text) and its grade, by prompt."""
    if not records:
        return None
    h = hashlib.sha256()
    for r in sorted(records, key=lambda r: (r.question_id, r.turn, r.repeat)):
        out = r.output_token_ids if r.output_token_ids is not None else r.output_text
        passed = None if r.grade is None else r.grade.passed
        h.update(f"{r.question_id}|{r.turn}|{r.repeat}|{passed}|{out}\n".encode())
    return h.hexdigest()[:16]

"""Measured retries: what a run's retry loop (bench/retry.py) did per task, and what the ledger prices from it.

Without a retry loop the ledger prices attempts and escalations by formula from the pass rate q and the cost
file's retries R: attempts (1 - (1-q)^(R+1)) / q, escalation (1-q)^(R+1) (ledger/cost_model.py). That assumes
every attempt is an independent draw at the first attempt's pass rate and costs what the first costs. A run with
a retry loop measured instead, per task: the attempts used, each one's device seconds and tokens, passed at
attempt k or escalated. The ledger then prices
- attempts per task as measured attempt-equivalents: the mean device seconds of a task's attempts over the mean
  device seconds of a first attempt (later attempts at a temperature, or carrying a failing test, cost what they
  measured), and
- escalation as the measured share of tasks no attempt passed;
and says which (`source`). A lossless speculative configuration shares its target's quality level, retries
included (its grading is its target's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, Field

from specledger.records.config import QUALITY_LEVEL
from specledger.records.results import RequestRecord


class AttemptStats(BaseModel):
    """One configuration's measured retry loop."""

    tasks: int
    max_attempts: int  # the most attempts any task was allowed (the policy's N)
    pass_at: list[float]  # pass@k, k = 1..max_attempts: the share of tasks passed within k attempts
    used: dict[int, int] = Field(default_factory=dict)  # attempts used -> tasks that passed at that attempt
    escalated: int = 0  # tasks no attempt passed
    device_s_first: float  # mean device seconds of a first attempt
    device_s_task: float  # mean device seconds of a task, all its attempts
    tokens_task: float  # mean output tokens of a task, all its attempts
    attempts_mean: float  # mean attempts per task (requests)
    source: str = ""  # whose loop it is: this configuration's, or its target's (shared grading)

    @property
    def escalation(self) -> float:
        return self.escalated / self.tasks if self.tasks else 0.0

    @property
    def attempt_equivalents(self) -> float:
        """Attempts per task in first-attempt device seconds: what the ledger multiplies the call cost by."""
        return self.device_s_task / self.device_s_first if self.device_s_first > 0 else self.attempts_mean


def stats_of(records: Iterable[RequestRecord]) -> AttemptStats | None:
    """The retry loop of one configuration's records (those that carry attempts), each task once."""
    tasks = [r for r in records if r.task_attempts]
    if not tasks:
        return None
    n, most = len(tasks), max(len(r.task_attempts) for r in tasks)
    passed_at = [next((a.k for a in r.task_attempts if a.passed), None) for r in tasks]
    limit = max(most, max((k for k in passed_at if k is not None), default=1))
    firsts = [r.task_attempts[0].device_s or 0.0 for r in tasks]
    return AttemptStats(
        tasks=n, max_attempts=limit,
        pass_at=[sum(1 for k in passed_at if k is not None and k <= j) / n for j in range(1, limit + 1)],
        used=dict(sorted(Counter(k for k in passed_at if k is not None).items())),
        escalated=sum(1 for k in passed_at if k is None),
        device_s_first=sum(firsts) / n, device_s_task=sum(sum(a.device_s or 0.0 for a in r.task_attempts) for r in tasks) / n,
        tokens_task=sum(sum(a.output_tokens for a in r.task_attempts) for r in tasks) / n,
        attempts_mean=sum(len(r.task_attempts) for r in tasks) / n)


def run_attempts(records: list[RequestRecord], sources: dict[str, str | None]) -> dict[str, AttemptStats]:
    """Configuration -> its measured retry loop: the quality level's where it has one, else its levels' records
    pooled; `sources` (configuration -> its quality source) lets a lossless arm share its target's."""
    own: dict[str, AttemptStats] = {}
    for name in sources:
        mine = [r for r in records if r.config == name and r.task_attempts]
        quality = [r for r in mine if r.load == QUALITY_LEVEL]
        s = stats_of(quality or mine)
        if s is not None:
            own[name] = s.model_copy(update={"source": name})
    out = dict(own)
    for name, src in sources.items():
        if name not in out and src and src in own:
            out[name] = own[src]
    return out


def describe(s: AttemptStats, name: str = "") -> str:
    """One line for tables and notes: the measured loop in words."""
    curve = ", ".join(f"pass@{k} {p:.0%}" for k, p in enumerate(s.pass_at, 1))
    shared = f", {s.source}'s (shared grading)" if s.source and s.source != name else ""
    return (f"measured retries ({s.tasks} tasks, up to {s.max_attempts} attempts{shared}): {curve}; "
            f"{s.attempt_equivalents:.2f} attempt-equivalents per task, {s.escalation:.0%} escalated")


FORMULA = "formula: (1-(1-q)^(R+1))/q attempts, (1-q)^(R+1) escalated (no retry loop measured)"


def attempts_source(m) -> str:
    """How a priced row's attempts and escalation were had (m: a ConfigMeasurement)."""
    return describe(m.retry, m.name) if m.retry is not None else FORMULA

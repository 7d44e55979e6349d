"""Where a saving comes from: the baseline's cost per task minus the recommendation's, split by source.

The recommendation's measurements are swapped into the baseline's priced case one at a time, on the same Monte Carlo
draws (so every step is paired): first its pass rate and its measured retry loop where it has one (quality:
attempts, tool calls and escalations), then its device time and energy per call (the change in the engine's compute
is speed, the change in its energy part is energy; energy estimated from device time, with no counter, is energy
too); what remains is the rest (maintenance, such as a draft head's retraining, and per-configuration inputs). The four parts add up to the saving in every
draw. A part's 95% interval that holds 0 is no evidence: the headline does not name it. Where the quality decision
shows no difference (ledger/same_quality.py) both are priced at one pass rate, so quality's part is exactly 0.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from pydantic import BaseModel

from specledger.ledger.cost_model import OperatingPoint, task_cost, with_value
from specledger.ledger.paired import LEVEL

SOURCES = ("speed", "energy", "quality", "rest")
LABELS = {"speed": "speed (device time)", "energy": "energy", "quality": "quality (pass rate: retries, escalations)",
          "rest": "the rest (maintenance, per-configuration inputs)"}


class SavingSource(BaseModel):
    """One source's part of the saving (baseline cost - recommended cost; positive: the recommendation saves)."""

    source: str  # "speed" | "energy" | "quality" | "rest"
    label: str  # for people: "speed (device time)"
    per_task: float  # at central values: the four add up to ScenarioAnswer.saving_per_task
    per_month: float | None = None  # per_task x tasks per month (central)
    low: float | None = None  # 95% interval of the monthly part (paired Monte Carlo draws; None without samples)
    high: float | None = None
    evidence: bool = False  # the interval excludes 0 (a part with no interval: it is not 0)
    share: float | None = None  # per_task / the saving per task


Case2 = tuple[dict, OperatingPoint]  # priced inputs and operating point (point values, or one value per draw)


def split(base: Case2, rec: Case2) -> dict[str, np.ndarray | float]:
    """Baseline cost minus recommended cost by source (see the module docstring), per draw where they are arrays."""
    (xb, ob), (xr, orec) = base, rec
    x1 = with_value(xb, ("acceptance", "pass_rate"), xr["acceptance"]["pass_rate"])
    o1 = replace(ob, pass_rate=orec.pass_rate, attempts=orec.attempts, escalation=orec.escalation)
    o2 = replace(o1, device_seconds_per_call=orec.device_seconds_per_call, requests_per_s=orec.requests_per_s,
                 device_count=orec.device_count, output_tokens_per_call=orec.output_tokens_per_call,
                 energy_j_per_call=orec.energy_j_per_call)
    c0, c1, c2, c3 = (task_cost(x, o) for x, o in ((xb, ob), (x1, o1), (x1, o2), (xr, orec)))
    energy = np.asarray(c1.energy) - np.asarray(c2.energy)
    return {"quality": np.asarray(c0.total) - c1.total, "speed": np.asarray(c1.total) - c2.total - energy,
            "energy": energy, "rest": np.asarray(c2.total) - c3.total}


def sources(central: dict[str, np.ndarray | float], drawn: dict[str, np.ndarray | float] | None, tasks_per_month: float,
            drawn_tasks: np.ndarray | float | None = None) -> list[SavingSource]:
    """The parts as the answer holds them: central values, and 95% intervals of the monthly parts from the draws."""
    total = sum(float(central[s]) for s in SOURCES)
    out = []
    for s in SOURCES:
        v = float(central[s])
        src = SavingSource(source=s, label=LABELS[s], per_task=v, per_month=v * tasks_per_month,
                           share=v / total if total else None)
        d = None if drawn is None else np.asarray(drawn[s], dtype=np.float64) * (
            tasks_per_month if drawn_tasks is None else drawn_tasks)
        if d is not None and np.isfinite(d).any():  # (a part no draw moves is one number: 0 for rented energy)
            tail = 100 * (1 - LEVEL) / 2
            src.low, src.high = (float(p) for p in np.percentile(d[np.isfinite(d)], [tail, 100 - tail]))
            src.evidence = src.low > 0 or src.high < 0
        else:
            src.evidence = v != 0
        out.append(src)
    return out


def carriers(parts: list[SavingSource], saving: float) -> list[SavingSource]:
    """The sources with evidence that carry the saving: in its direction, largest first, each at least a fifth of it
    (the headline names them)."""
    same_way = [p for p in parts if p.evidence and p.per_task * saving > 0 and abs(p.per_task) >= 0.2 * abs(saving)]
    return sorted(same_way, key=lambda p: -abs(p.per_task))

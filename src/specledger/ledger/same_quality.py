"""Quality decided once: each configuration's graded answers against the reference's, paired on the same items.

The test is a non-inferiority design on the paired difference in pass rate, d = (b - c) / n over the n items
graded under both (b: items only the configuration passes, c: items only the reference passes). Its 95% interval
is exact: Clopper-Pearson on the share of the b + c discordant items that go the configuration's way (given b + c,
the distribution of the exact McNemar test), mapped to d. It decides:
- "better" / "worse": the interval excludes 0 (exact McNemar p < 0.05): quality differs; every configuration is
  priced at its own measured pass rate, and a saving (or loss) through the pass rate is quality's;
- "same": the interval holds 0 and its lower end is above -MARGIN: no difference shown, and the configuration is
  shown to be at most MARGIN worse (non-inferior): priced at the reference's pass rate;
- "not shown": the interval holds 0 but reaches below -MARGIN: no difference shown either, so priced at the
  reference's pass rate as well, but non-inferiority is not established (more graded items would tell).
Pricing at one pass rate where no difference is shown keeps a pass-rate wobble out of the cost: the Monte Carlo
then draws one pass rate for both, and a saving can only come from speed, energy or the rest. Failed requests stay
each configuration's own (a failed request is a failed attempt, whatever the quality of the answers).
"""

from __future__ import annotations

from dataclasses import asdict

from pydantic import BaseModel
from scipy.stats import beta

from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.paired import mcnemar

LEVEL = 0.95
MARGIN = 0.05  # non-inferiority margin: 5 points of pass rate (the demo's 272 graded items resolve about +-3)
SHARED = ("same", "not shown")  # decisions priced at the reference's pass rate


class QualityDecision(BaseModel):
    """One configuration's quality against the reference (this module's docstring). The quality table, the
    verdicts (through the pass rate each row is priced at), the answer and the page's calculator all read it;
    ledger.json holds one per configuration under `quality` (a dict of these fields)."""

    config_a: str  # the reference (autoregressive at the reference precision)
    config_b: str  # the configuration tested
    items: int  # graded under both
    a_only: int  # items the reference passes and config_b fails (with repeats: the larger share of passes)
    b_only: int  # items config_b passes and the reference fails
    p_value: float  # exact McNemar, two-sided
    difference: float | None = None  # config_b's pass rate minus the reference's on the common items
    low: float | None = None  # 95% interval of `difference` (exact, see above)
    high: float | None = None
    margin: float = MARGIN  # the non-inferiority margin (a fraction: 0.05 = 5 points)
    decision: str = "untested"  # "same" | "not shown" | "better" | "worse" | "untested" (nothing graded in common)
    priced_at: str = "own"  # "shared": at config_a's pass rate | "own": its own measured one | "cost file"
    grades_from: str = ""  # whose graded answers config_b's are (lossless speculation: its target's)
    note: str = ""  # the decision in one sentence

    @property
    def shared(self) -> bool:
        return self.decision in SHARED


def decide(ref: str, ref_grades: dict[str, float], name: str, grades: dict[str, float],
           grades_from: str = "") -> QualityDecision:
    """The paired non-inferiority decision of `name` against `ref` (see the module docstring)."""
    t = mcnemar(ref, ref_grades, name, grades)  # the counts and the exact p-value
    d = QualityDecision(**{k: v for k, v in asdict(t).items() if k != "note"}, grades_from=grades_from or name)
    borrowed = f" ({name}'s graded answers are {grades_from}'s: lossless)" if grades_from and grades_from != name else ""
    if not t.items:
        d.note = f"no item graded under both {name} and {ref}: quality not compared" + borrowed
        return d
    n, b_only, k = t.items, t.b_only, t.a_only + t.b_only
    d.difference = sum(grades[q] - ref_grades[q] for q in ref_grades.keys() & grades.keys()) / n
    if k == 0:
        d.low = d.high = 0.0
        d.decision, d.priced_at = "same", "shared"
        d.note = f"{t.note}: the same quality" + borrowed
        return d
    tail = (1 - LEVEL) / 2
    lo = 0.0 if b_only == 0 else float(beta.ppf(tail, b_only, k - b_only + 1))
    hi = 1.0 if b_only == k else float(beta.ppf(1 - tail, b_only + 1, k - b_only))
    d.low, d.high = (2 * lo - 1) * k / n, (2 * hi - 1) * k / n
    span = (f"difference {100 * d.low:+.1f} to {100 * d.high:+.1f} points, 95%; {b_only} vs {t.a_only} discordant "
            f"of {n}, exact McNemar p={d.p_value:.2g}")
    if d.low > 0 or d.high < 0:
        d.decision = "better" if d.low > 0 else "worse"
        d.note = (f"quality differs: {name} passes {'more' if d.low > 0 else 'less'} than {ref} ({span}); each is "
                  "priced at its own pass rate") + borrowed
    else:
        d.decision, d.priced_at = ("same" if d.low >= -MARGIN else "not shown"), "shared"
        points = f"{100 * MARGIN:g} points"
        within = (f"at most {points} worse (non-inferior)" if d.decision == "same" else
                  f"not shown to be at most {points} worse (non-inferiority not established: more graded items would "
                  "tell)")
        d.note = f"no difference shown ({span}): {within}; priced at {ref}'s pass rate" + borrowed
    return d


def _graded(ms: list[ConfigMeasurement], name: str) -> ConfigMeasurement | None:
    """The configuration's level with the most graded items (a graded quality level stands for every level)."""
    return max((m for m in ms if m.name == name and m.grades), key=lambda m: len(m.grades), default=None)


def decide_all(ms: list[ConfigMeasurement], ref: str | None) -> dict[str, QualityDecision]:
    """Configuration name -> its decision against `ref` (only configurations with graded items, the ref's too)."""
    base = _graded(ms, ref) if ref is not None else None
    if base is None or ref is None:
        return {}
    names = dict.fromkeys(m.name for m in ms if m.name != ref)
    return {n: decide(ref, base.grades, n, g.grades, g.grades_from) for n in names if (g := _graded(ms, n))}


def at_shared_quality(ms: list[ConfigMeasurement], decisions: dict[str, QualityDecision],
                      ref: str | None) -> list[ConfigMeasurement]:
    """The measurements to price: a configuration whose decision shows no difference takes the reference's graded
    items (so its pass rate, and its Monte Carlo draws of it, are the reference's) and its measured retry loop, if
    any (ledger/attempts.py: attempts and escalations), keeping its own failed requests."""
    base = _graded(ms, ref) if ref is not None else None
    if base is None:
        return list(ms)
    out = []
    for m in ms:
        d = decisions.get(m.name)
        if d is not None and d.shared and m.grades:
            # the reference's grade of each item this configuration answered: an item whose request failed here is
            # its failure, not also the reference's answer (a failed request counted twice read 6/7 for 5/6)
            grades = {k: base.grades[k] for k in m.grades if k in base.grades}
            m = m.model_copy(update={"grades": grades, "passes": sum(grades.values()),
                                     "graded": len(grades) + m.requests_failed, "retry": base.retry})
        out.append(m)
    return out

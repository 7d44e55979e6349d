"""The answer first: per cost scenario, which configuration to run, what an accepted task costs with it, what it
saves against the baseline, how sure that is, and from which value of the main inputs the choice matters.

Computed once here from the priced rows and their paired Monte Carlo samples (the verdicts of verdicts.py, no
second rule), and read by every output that ends a run: the terminal (report/terminal.py), `ledger.json` /
`--json`, and the HTML report.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np
from pydantic import BaseModel, Field

from specledger.ledger.cost_model import Case
from specledger.ledger.inputs import Resolved
from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.paired import difference
from specledger.ledger.thresholds import (DIFFERS, INPUTS, OWNED_PRICE, REVIEW, TIE, Crossing, Search, curve, find)
from specledger.ledger.verdicts import MATERIAL, Row


class Threshold(BaseModel):
    """Where moving one input alone (everything else as priced) changes the answer.

    `value` is where the verdict of verdicts.py changes (paired Monte Carlo, a difference only beyond 1% of the cost
    with a 95% interval); `low`/`high` bound where it may really change: the 2.5th and 97.5th percentiles, over the
    Monte Carlo samples, of the value at which that sample's gap between the two configurations deciding the change
    crosses the same 1% margin (a bound is None when more than 2.5% of the samples do not cross within the searched
    range; a bound at `current` says the change may already have happened). The verdict, sure at 95%, changes near
    one end of that interval."""

    input: str  # dotted inputs path: acceptance.review_minutes, acceptance.fix_minutes, acceptance.wage_per_hour,
    # volume.tasks_per_month, hardware.price_per_device_hour (or hardware.purchase_price), acceptance.pass_rate
    label: str  # for people: "review minutes per task"
    unit: str = ""  # "min", "$/h", "tasks/month", "" (a fraction)
    current: float | None = None  # the input's central value now (pass rate: the baseline's)
    value: float | None = None  # where the verdict changes; None: it does not within [searched_low, searched_high]
    low: float | None = None  # interval of the crossing (see above)
    high: float | None = None
    side: str = ""  # "below" | "above": the changed answer holds on this side of `value`
    searched_low: float = 0.0  # the range searched
    searched_high: float = 0.0
    before: str = ""  # the answer at the current value: a configuration's name, or "tie"
    after: str = ""  # the answer past the threshold: a configuration's name, "tie", or "differs" (some verdict is
    # not a tie, but no single configuration is cheapest)
    change: str = ""  # the sentence: "the decoding choice matters when the review time per task is below 2 s ..."
    matters_side: str = ""  # "below" | "above": where the decoding choice matters (one side is a tie); "": it
    # matters on both sides (one clear choice gives way to another), or no change was found


class CurvePoint(BaseModel):
    x: float  # the input's value (review minutes per task for `Answer.curve`)
    cost: float | None  # cost per accepted task at central values of everything else (None: infinite)
    low: float | None = None  # 90% interval (5th-95th percentile, as the cost table's)
    high: float | None = None


class CurveSeries(BaseModel):
    """One configuration's cost per accepted task against one input (for a chart: one line per configuration)."""

    config: str
    points: list[CurvePoint] = Field(default_factory=list)


class HumanStanding(BaseModel):
    """One configuration against a person doing the task (when the cost inputs give `human:`)."""

    config: str
    cost: float | None  # the configuration's cost per accepted task
    ratio: float | None  # cost / the person's cost per task (below 1: cheaper than the person)
    saving_per_task: float | None  # the person's cost - this configuration's (positive: the model is cheaper)


class ScenarioAnswer(BaseModel):
    """The decision for one cost scenario (the cost file's `scenarios`, or the inputs as written: scenario "")."""

    scenario: str  # the scenario's name ("" when the cost file names none)
    recommended: str | None = None  # the configuration to run: the cheapest by the verdict; in a tie, the tied
    # configuration with the lowest central cost (any of `tied_with` costs the same within 1%); None: none priced
    verdict: str = ""  # the recommended row's verdict, verdicts.py's word: "cheapest" | "indistinguishable" | ...
    confidence: str = ""  # how sure, in words, from that verdict and its 95% interval
    tied_with: list[str] = Field(default_factory=list)  # configurations that cannot be told apart from it
    cost: float | None = None  # its cost per accepted task (central values)
    cost_low: float | None = None  # 90% interval (5th-95th percentile of the Monte Carlo)
    cost_high: float | None = None
    baseline: str | None = None  # autoregressive at the reference precision (LedgerResult.reference)
    baseline_cost: float | None = None
    saving_per_task: float | None = None  # baseline cost - recommended cost (positive: the recommendation saves)
    saving_per_month: float | None = None  # saving_per_task x tasks per month (central)
    saving_low: float | None = None  # 95% interval of the monthly saving (paired samples, volume drawn with them)
    saving_high: float | None = None
    tasks_per_month: float | None = None
    shares: dict[str, float] = Field(default_factory=dict)  # the recommended configuration's cost split:
    # engine (device compute), tools (retrieval, tool calls), labour, maintenance, energy; they sum to 1
    labour_share: float | None = None  # shares["labour"], for the sentence
    tie: bool = False  # every priced candidate is indistinguishable: the decoding choice does not matter here
    tie_reason: str = ""  # why they tie: labour's share, and the threshold from which the choice matters
    thresholds: list[Threshold] = Field(default_factory=list)  # one per main input searched, crossings first
    curve_input: str = "acceptance.review_minutes"  # what `curve` varies
    curve: list[CurveSeries] = Field(default_factory=list)  # cost per task against review minutes, per config
    human_cost: float | None = None  # a person doing the task: minutes x wage (None: not given)
    human: list[HumanStanding] = Field(default_factory=list)  # each priced configuration against that person
    headline: str = ""  # the answer in one or two sentences, for the first line of every output


class Answer(BaseModel):
    """The answer block: one entry per scenario of the cost inputs, the headline scenario first."""

    scenarios: list[ScenarioAnswer] = Field(default_factory=list)


class Priced(Row, Protocol):  # the fields of ledger.price.ConfigCost read here
    p5: float | None
    p95: float | None

    @property
    def cost_shares(self) -> dict[str, float]: ...


REVIEW_PATH = ".".join(REVIEW.path)
ELIGIBLE = ("cheapest", "indistinguishable", "dominated", "trade-off")  # verdicts of configurations in the running


def _recommend(rows: Sequence[Priced], baseline: str | None) -> Priced | None:
    """The "cheapest" row; else, in the cheapest tie group, the baseline when it is there (nothing to gain by a
    change), or the group's lowest central cost; else the lowest central cost among the candidates."""
    cands = [r for r in rows if r.verdict in ELIGIBLE and r.total is not None]
    tied = [r for r in cands if r.verdict == "indistinguishable"]
    for pool in ([r for r in cands if r.verdict == "cheapest"], [r for r in tied if r.name == baseline], tied, cands):
        if pool:
            return min(pool, key=lambda r: r.total or 0.0)
    return None


def _confidence(rec: Priced, tie: bool, tested: bool) -> str:
    """The verdict of verdicts.py in words."""
    if not tested:
        return "point estimates only (no Monte Carlo samples): nothing is said about noise"
    if rec.verdict == "cheapest":
        return "clear: " + (rec.verdict_detail or "the only configuration in the running")
    if tie:
        return (f"a tie: no configuration costs more than another by over {MATERIAL:.0%} of the cost per task with "
                "95% confidence, so any of them will do")
    if rec.verdict == "indistinguishable":
        return (f"a tie at the top: {rec.verdict_detail}; every other configuration costs more by over "
                f"{MATERIAL:.0%} (95%)")
    return f"{rec.verdict}: {rec.verdict_detail}"


def duration(minutes: float) -> str:
    """Review-sized durations for people: "2 s", "30 s", "1.5 min", "2.5 h"."""
    if minutes <= 0:
        return "0 s"
    if minutes < 1:
        return f"{_sig(minutes * 60)} s"
    return f"{_sig(minutes)} min" if minutes < 120 else f"{_sig(minutes / 60)} h"


def _sig(v: float, digits: int = 2) -> str:
    """`digits` significant figures, without an exponent: 0.034, 2, 150, 39,000."""
    r = float(f"{v:.{digits}g}")
    return f"{r:,.0f}" if abs(r) >= 10 ** (digits - 1) else f"{r:g}"


def amount(v: float, unit: str) -> str:
    """An input's value with its unit, for a sentence."""
    if unit == "min":
        return duration(v)
    if unit.startswith("$"):
        return f"${_sig(v)}{unit[1:]}"
    if unit == "":
        return f"{v:.0%}"
    return f"{_sig(v)} {unit}"


def _span(low: float | None, high: float | None, fmt: Callable[[float], str], now: float | None = None) -> str:
    """" (95%: 1 s–3 s)", with an open end where too few samples cross within the range searched, and "today's"
    for an end at the current value (the change may already have happened)."""
    if low is not None and high is not None:
        if now is not None and low == now:
            return f" (95%: today's to {fmt(high)})"
        if now is not None and high == now:
            return f" (95%: {fmt(low)} to today's)"
        return f" (95%: {fmt(low)}–{fmt(high)})"
    if low is not None:
        return f" (95%: {fmt(low)} or more)"
    return "" if high is None else f" (95%: up to {fmt(high)})"


def threshold_model(c: Crossing) -> Threshold:
    """A crossing as the answer block holds it, with its sentence."""
    t = Threshold(input=".".join(map(str, c.input.path)), label=c.input.label, unit=c.input.unit,
                  **{k: v for k, v in vars(c).items() if k != "input"})  # the crossing's own fields, by name
    unit = c.input.unit
    if TIE in (c.before, c.after) and c.value is not None:
        t.matters_side = c.side if c.before == TIE else ("above" if c.side == "below" else "below")
    if c.value is None:
        t.change = (f"no change with {c.input.label} anywhere from {amount(c.searched_low, unit)} to "
                    f"{amount(c.searched_high, unit)}")
        return t
    span = _span(c.low, c.high, lambda v: amount(v, unit), c.current)
    when = f"when {c.input.label} is {c.side} {amount(c.value, unit)}{span}"
    if c.before == TIE:
        lead = "the decoding choice matters " + when + (f": {c.after} is cheapest there"
                                                        if c.after not in (TIE, DIFFERS) else "")
    elif c.after == TIE:
        lead = f"every configuration ties {when}"
    elif c.after == DIFFERS:
        lead = f"{c.before} stops being the clear choice {when}"
    else:
        lead = f"{c.after} becomes the clear choice {when}"
    t.change = f"{lead} (now {amount(c.current, unit) if c.current is not None else '–'})"
    return t


def _curve_values(current: float, value: float | None) -> list[float]:
    """Review minutes from none to a few times today's: a second of review, then half-decade steps."""
    top = max(1.0, 3 * current)
    xs = {0.0, current, *(float(v) for v in 10.0 ** np.arange(-3, np.log10(top) + 0.01, 0.25))}
    if value is not None:
        xs.add(value)
    return sorted(x for x in xs if x <= top)


def scenario_answer(scenario: str, rows: Sequence[Priced], chosen: list[tuple[Priced, Case, Resolved, ConfigMeasurement]],
                    reference: str | None, costs: dict[str, np.ndarray] | None, *, samples: int, seed: int,
                    thresholds: bool = True) -> ScenarioAnswer:
    """The decision for one scenario, from its priced rows (verdicts set) and their paired cost samples."""
    out = ScenarioAnswer(scenario=scenario, baseline=reference)
    rec = _recommend(rows, reference)
    if rec is None:
        out.headline = "no configuration could be priced: see each row's verdict"
        return out
    cands = [c for c in chosen if c[0].verdict in ELIGIBLE and c[0].total is not None]
    eligible = [c[0] for c in cands]
    by_name = {r.name: r for r in rows}
    base = by_name.get(reference or "")
    case = next(c[1] for c in cands if c[0] is rec)
    tpm = float(case.x["volume"]["tasks_per_month"])
    out.recommended, out.verdict, out.cost, out.cost_low, out.cost_high = rec.name, rec.verdict, rec.total, rec.p5, rec.p95
    out.tie = len(eligible) > 1 and all(r.verdict == "indistinguishable" for r in eligible)
    out.tied_with = [r.name for r in eligible if r.verdict == "indistinguishable" and r is not rec]
    out.confidence = _confidence(rec, out.tie, costs is not None)
    out.tasks_per_month = tpm
    out.shares = rec.cost_shares
    out.labour_share = out.shares.get("labour")
    search = Search(cands, [c[1:] for c in chosen], samples, seed) if costs is not None and samples > 0 else None
    if base is not None and base.total is not None:
        out.baseline_cost = base.total
        out.saving_per_task = base.total - (rec.total or 0.0)
        out.saving_per_month = out.saving_per_task * tpm
        # the monthly saving's interval: the paired cost samples times tasks per month as drawn with them
        if search is not None and costs is not None and base.name in costs and rec.name in costs:
            tpm_drawn = np.broadcast_to(np.asarray(search.drawn[0][0]["volume"]["tasks_per_month"], np.float64), (search.n,))
            if (d := difference(costs[base.name] * tpm_drawn, costs[rec.name] * tpm_drawn)) is not None:
                out.saving_low, out.saving_high = d.low, d.high
    _human(out, rows, case)
    if search is not None and thresholds and len(cands) > 1:
        inputs = INPUTS if case.x["hardware"]["kind"] == "rented" else INPUTS[:4] + (OWNED_PRICE, INPUTS[5])
        out.thresholds = sorted((threshold_model(c) for inp in inputs if (c := find(search, inp)) is not None),
                                key=lambda t: t.value is None)
        review = next((t for t in out.thresholds if t.input == REVIEW_PATH), None)
        now = search.current(REVIEW) or 0.0
        out.curve = [CurveSeries(config=name, points=[CurvePoint(x=x, cost=c, low=lo, high=hi) for x, c, lo, hi in pts])
                     for name, pts in curve(search, REVIEW, _curve_values(now, review.value if review else None))]
    totals = [r.total or 0.0 for r in eligible]
    spread = max(totals) / min(totals) - 1 if min(totals) > 0 else 0.0
    out.tie_reason = _tie_reason(out, case, spread) if out.tie else ""  # a tie at the top: `confidence` says it
    out.headline = _headline(out)
    return out


def _human(out: ScenarioAnswer, rows: Sequence[Priced], case: Case) -> None:
    """Each priced configuration against a person doing the task, when the inputs say what that costs."""
    h = case.x.get("human") or {}
    if h.get("minutes") is None:
        return
    wage = h.get("wage_per_hour")
    out.human_cost = float(h["minutes"]) * float(wage if wage is not None else case.x["acceptance"]["wage_per_hour"]) / 60
    for r in rows:
        if r.verdict in ELIGIBLE and r.total is not None:
            out.human.append(HumanStanding(config=r.name, cost=r.total,
                                           ratio=r.total / out.human_cost if out.human_cost else None,
                                           saving_per_task=out.human_cost - r.total))


def _tie_reason(out: ScenarioAnswer, case: Case, spread: float) -> str:
    """Why they tie: what the decoding choice can move (the engine's compute and energy) is a small share of the
    cost per task next to labour, tools and maintenance, which it cannot move; and from where it would matter."""
    s = out.shares
    acc = case.x["acceptance"]
    movable = s.get("engine", 0.0) + s.get("energy", 0.0)
    fixed = {"labour": s.get("labour", 0.0), "maintenance": s.get("maintenance", 0.0), "tools": s.get("tools", 0.0)}
    big = max(fixed, key=lambda k: fixed[k])
    detail = ""
    if big == "labour":
        detail = (f" ({duration(acc['review_minutes'])} of review at ${_sig(acc['wage_per_hour'])}/h"
                  + (f", {duration(acc['fix_minutes'])} to fix an escalated task" if acc["fix_minutes"] else "") + ")")
    why = (f"{big} is {fixed[big]:.0%} of the cost per task{detail} and the engine's compute {movable:.1%}: no "
           f"configuration costs more than another by over {MATERIAL:.0%} with 95% confidence")
    if spread > MATERIAL:  # apart at the centre, not beyond the noise: the measurements cannot tell them apart
        why += (f" (their central costs differ by up to {spread:.0%}, through the measured pass rates and device "
                "time, but within their noise: more graded items or requests would tell)")
    crossing = next((t for t in out.thresholds if t.value is not None and t.before == TIE), None)
    if crossing is not None:
        why += f"; {crossing.change.split(' (now ')[0]}"
    return why


def _headline(out: ScenarioAnswer) -> str:
    name = f"{out.scenario}: " if out.scenario else ""
    cost = _money(out.cost) + ("" if out.cost_low is None or out.cost_high is None else
                               f" ({_money(out.cost_low)}–{_money(out.cost_high)}, 90%)")
    if out.tie:
        first = f"{name}the decoding choice does not matter: every configuration costs about {cost} per accepted task"
        if out.recommended == out.baseline:
            first += f"; keep {out.baseline}"
    elif out.recommended == out.baseline:
        first = f"{name}keep {out.baseline}: {cost} per accepted task"
        if out.tied_with:
            first += f" ({', '.join(out.tied_with)} cost the same within {MATERIAL:.0%})"
    else:
        first = f"{name}run {out.recommended}: {cost} per accepted task"
        if out.tied_with:
            first += f" (or {', '.join(out.tied_with)}: the same within {MATERIAL:.0%})"
        if out.baseline and out.saving_per_month is not None:
            span = ("" if out.saving_low is None or out.saving_high is None else
                    f" ({_money(out.saving_low)}–{_money(out.saving_high)}, 95%)")
            first += f", saving {_money(out.saving_per_month)} a month{span} against {out.baseline}"
    review = next((t for t in out.thresholds if t.input == REVIEW_PATH and t.value is not None), None)
    if review is not None and out.tie:
        first += f"; {review.change.split(' (now ')[0]}"
    return first


def _money(v: float | None) -> str:
    if v is None:
        return "–"
    sign = "-" if v < 0 else ""
    v = abs(v)
    if v >= 100:
        return f"{sign}${v:,.0f}"
    return f"{sign}${v:.2f}" if v >= 1 else f"{sign}${v:.3g}"


def link_scenarios(answer: Answer) -> None:
    """A scenario where every configuration ties and the review time alone cannot change that (other labour holds
    it) borrows another scenario's review-time threshold: from which review time the decoding choice matters."""
    for a in answer.scenarios:
        if not a.tie or any(t.input == REVIEW_PATH and t.value is not None for t in a.thresholds):
            continue
        other = next(((o, t) for o in answer.scenarios if o is not a for t in o.thresholds
                      if t.input == REVIEW_PATH and t.matters_side and t.value is not None), None)
        if other is None:
            continue
        o, t = other
        span = _span(t.low, t.high, duration)
        note = (f"in the {o.scenario} scenario the decoding choice matters when the review time per task is "
                f"{t.matters_side} {duration(t.value or 0.0)}{span}")
        a.tie_reason += f"; {note}"
        a.headline += f". {note[0].upper()}{note[1:]}"

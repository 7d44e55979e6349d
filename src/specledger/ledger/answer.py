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
from specledger.ledger.same_quality import MARGIN, QualityDecision
from specledger.ledger.saving_sources import LABELS, SavingSource, carriers, sources, split
from specledger.ledger.thresholds import (DIFFERS, INPUTS, OWNED_PRICE, REVIEW, TIE, Crossing, Search, curve, find,
                                          gaps_move)
from specledger.ledger.verdicts import MATERIAL, Row, signed_pct


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
    # matters on both sides (one clear choice gives way to another), no change was found, or dollars do not move
    dollars_move: bool = True  # False: the input adds the same dollars to every configuration (review minutes do),
    # so no gap between them moves with it; `value` is then only where those fixed gaps cross the relative 1% margin,
    # not a change of the choice (`change` says so; the headline and `tie_reason` never quote it)


class CurvePoint(BaseModel):
    x: float  # the input's value (review minutes per task for `Answer.curve`)
    cost: float | None  # cost per accepted task at central values of everything else (None: infinite)
    low: float | None = None  # 90% interval (5th-95th percentile, as the cost table's)
    high: float | None = None


class CurveSeries(BaseModel):
    """One configuration's cost per accepted task against one input (for a chart: one line per configuration)."""

    config: str
    points: list[CurvePoint] = Field(default_factory=list)


class TiedSpan(BaseModel):
    """A configuration the recommendation cannot be told apart from: its cost per task minus the recommendation's."""

    config: str
    low: float  # 95% interval of the paired difference per task (Monte Carlo)
    high: float
    low_pct: float  # the same as a share of the recommendation's cost per task
    high_pct: float
    within_margin: bool  # the whole interval within +-1% (verdicts.MATERIAL): "the same within 1%" is true


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
    tied_with: list[str] = Field(default_factory=list)  # configurations that cannot be told apart from it (`tied`:
    # each one's difference interval; "the same within 1%" only where that whole interval is)
    cost: float | None = None  # its cost per accepted task (central values)
    cost_low: float | None = None  # 90% interval (5th-95th percentile of the Monte Carlo), as the cost table's
    cost_high: float | None = None  # (the headline quotes `cost` alone: its statements are all 95%)
    baseline: str | None = None  # autoregressive at the reference precision (LedgerResult.reference)
    baseline_cost: float | None = None
    saving_per_task: float | None = None  # baseline cost - recommended cost (positive: the recommendation saves)
    saving_per_month: float | None = None  # saving_per_task x tasks per month (central)
    saving_low: float | None = None  # 95% interval of the monthly saving (paired samples, volume drawn with them)
    saving_high: float | None = None
    tasks_per_month: float | None = None
    sources: list[SavingSource] = Field(default_factory=list)  # the saving split by source (speed, energy, quality,
    # the rest; ledger/saving_sources.py), each with its 95% interval; empty where no saving is computed
    saving_from: list[str] = Field(default_factory=list)  # the sources the headline names: those with evidence
    # that carry the saving, largest first ("speed", "energy", "quality", "rest"); empty: no saving claimed
    quality: str = ""  # the recommendation's quality decision against the baseline, in words (same_quality.py)
    quality_decision: str = ""  # its word: "same" | "not shown" | "better" | "worse" | "untested" | "" (none made)
    tied: list[TiedSpan] = Field(default_factory=list)  # `tied_with`, each with its difference interval
    not_searched: list[str] = Field(default_factory=list)  # inputs not searched for a threshold, and why ("the
    # review time per task: 0 in this scenario")
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


def _confidence(rec: Priced, tie: bool, tested: bool, tied: list[TiedSpan]) -> str:
    """The verdict of verdicts.py in words: "the same within 1%" only where every tied interval is."""
    if not tested:
        return "point estimates only (no Monte Carlo samples): nothing is said about noise"
    if rec.verdict == "cheapest":
        return "clear: " + (rec.verdict_detail or "the only configuration in the running")
    if tie and tied and all(t.within_margin for t in tied):
        return f"a tie: every configuration costs the same within {MATERIAL:.0%} (95%), so any of them will do"
    if tie:
        return (f"a tie: {_tied_words(tied, rec.name)}; none is shown to cost more than the cheapest by over "
                f"{MATERIAL:.0%}")
    if rec.verdict == "indistinguishable":
        return (f"a tie at the top: {_tied_words(tied, rec.name) if tied else rec.verdict_detail}; every other "
                f"configuration costs more by over {MATERIAL:.0%} (95%)")
    return f"{rec.verdict}: {rec.verdict_detail}"


def _tied(rec: Priced, names: list[str], costs: dict[str, np.ndarray] | None) -> list[TiedSpan]:
    """Each tied configuration's paired cost difference with the recommendation (95%), in dollars and as a share."""
    out: list[TiedSpan] = []
    if costs is None or rec.name not in costs or not rec.total:
        return out
    for n in names:
        if n in costs and (d := difference(costs[n], costs[rec.name])) is not None:
            lo, hi = d.low / rec.total, d.high / rec.total
            out.append(TiedSpan(config=n, low=d.low, high=d.high, low_pct=lo, high_pct=hi,
                                within_margin=-MATERIAL <= lo and hi <= MATERIAL))
    return out


def _tied_words(tied: list[TiedSpan], whom: str = "it") -> str:
    """"ar-w8 cannot be told apart (difference -5% to +21%)"; "the same within 1%" only where it is."""
    return "; ".join(f"{t.config} costs the same within {MATERIAL:.0%} (95%)" if t.within_margin else
                     f"{t.config} cannot be told apart from {whom} (difference {signed_pct(t.low_pct)} to "
                     f"{signed_pct(t.high_pct)}, 95%)" for t in tied)


def _sources(out: ScenarioAnswer, search: Search | None, base: tuple | None, rec_case: Case) -> None:
    """The saving split by source (ledger/saving_sources.py): central values, and per draw with the Monte Carlo."""
    if base is None or out.saving_per_task is None or out.tasks_per_month is None:
        return
    central = split((base[1].x, base[1].op), (rec_case.x, rec_case.op))
    drawn, tpm = None, None
    if search is not None and {base[0].name, out.recommended} <= set(search.names()):
        names = search.names()
        b, r = search.drawn[names.index(base[0].name)], search.drawn[names.index(out.recommended or "")]
        drawn, tpm = split(b, r), r[0]["volume"]["tasks_per_month"]
    out.sources = sources(central, drawn, out.tasks_per_month, tpm)


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


def threshold_model(c: Crossing, dollars_move: bool = True) -> Threshold:
    """A crossing as the answer block holds it, with its sentence. `dollars_move` False (thresholds.gaps_move): the
    input moves no gap between configurations, so the crossing is the relative margin's alone and is not worded as
    the choice changing."""
    t = Threshold(input=".".join(map(str, c.input.path)), label=c.input.label, unit=c.input.unit,
                  dollars_move=dollars_move, **{k: v for k, v in vars(c).items() if k != "input"})
    unit = c.input.unit
    if not dollars_move and c.value is not None:
        span = _span(c.low, c.high, lambda v: amount(v, unit), c.current)
        moves = "rises over" if c.before == TIE else "falls under"
        t.change = (f"no change in dollars with {c.input.label}: it adds the same to every configuration, so the gaps "
                    f"between them stay as priced; only their share of the cost per task {moves} the {MATERIAL:.0%} "
                    f"margin when it is {c.side} {amount(c.value, unit)}{span} (now {amount(c.current, unit)})")
        return t
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
                    thresholds: bool = True, quality: dict[str, QualityDecision] | None = None) -> ScenarioAnswer:
    """The decision for one scenario, from its priced rows (verdicts set), their paired cost samples and the quality
    decisions against the reference (ledger/same_quality.py: which pass rate each row is priced at)."""
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
    out.tied = _tied(rec, out.tied_with, costs)
    out.confidence = _confidence(rec, out.tie, costs is not None, out.tied)
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
        if base is not rec:
            _sources(out, search, next((c for c in chosen if c[0] is base), None), case)
    qd = (quality or {}).get(rec.name)
    if qd is not None and reference is not None and rec.name != reference:
        out.quality, out.quality_decision = qd.note, qd.decision
    _human(out, rows, case)
    if search is not None and thresholds and len(cands) > 1:
        inputs = INPUTS if case.x["hardware"]["kind"] == "rented" else INPUTS[:4] + (OWNED_PRICE, INPUTS[5])
        searched = []
        for inp in inputs:
            if inp.kind != "fraction" and search.current(inp) == 0:  # not part of this scenario (no review in it)
                out.not_searched.append(f"{inp.label}: 0 in this scenario")
            elif (c := find(search, inp)) is not None:
                searched.append(threshold_model(c, c.value is None or gaps_move(search, inp.path, c.current, c.value)))
        out.thresholds = sorted(searched, key=lambda t: (t.value is None, not t.dollars_move))
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
           f"configuration is shown to cost more than another by over {MATERIAL:.0%} (95%)")
    if spread > MATERIAL:  # apart at the centre, not beyond the noise: the measurements cannot tell them apart
        why += (f" (their central costs differ by up to {spread:.0%}, through the measured device time, or pass rates "
                "where quality differs, but within their noise: more requests or graded items would tell)")
    crossing = _matters(out)
    if crossing is not None:
        why += f"; {crossing.change.split(' (now ')[0]}"
    return why


def _matters(out: ScenarioAnswer) -> Threshold | None:
    """The first input from whose value on the decoding choice matters in dollars (a tie gives way)."""
    return next((t for t in out.thresholds if t.value is not None and t.before == TIE and t.dollars_move), None)


def _headline(out: ScenarioAnswer) -> str:
    """The answer in a sentence: every interval in it a 95% one, every figure the table's central value."""
    name = f"{out.scenario}: " if out.scenario else ""
    cost = money(out.cost)
    tied = _tied_words(out.tied)
    verb = f"keep {out.baseline}" if out.recommended == out.baseline else f"run {out.recommended}"
    if out.tie and out.tied and all(t.within_margin for t in out.tied):
        first = (f"{name}the decoding choice does not matter: every configuration costs {cost} per accepted task "
                 f"within {MATERIAL:.0%} (95%)") + (f"; keep {out.baseline}" if out.recommended == out.baseline else "")
    elif out.tie:
        first = (f"{name}no configuration is shown to cost less than another by over {MATERIAL:.0%}: {verb}, {cost} "
                 f"per accepted task" + (f"; {tied}" if tied else ""))
    elif out.recommended == out.baseline or out.saving_per_month is None or not out.baseline:
        first = f"{name}{verb}: {cost} per accepted task" + (f"; {tied}" if tied else "")
    else:
        span = ("" if out.saving_low is None or out.saving_high is None else
                f" (95%: {money(out.saving_low)}–{money(out.saving_high)})")
        first = f"{name}{verb}: {cost} per accepted task, saving {money(out.saving_per_month)} a month{span} against {out.baseline}"
        out.saving_from = [p.source for p in carriers(out.sources, out.saving_per_task or 0.0)]
        if out.saving_from:
            first += ", from " + " and ".join(_source_words(out, s) for s in out.saving_from)
        elif out.sources:
            first += ", no one source shown alone (see the split)"
        if tied:
            first += f"; {tied}"
    if out.quality_decision == "not shown":
        first += (f"; {out.recommended}'s quality is not shown to be at most {100 * MARGIN:g} points below "
                  f"{out.baseline}'s (priced at its pass rate: no difference shown)")
    crossing = _matters(out)
    if crossing is not None and out.tie:
        first += f"; {crossing.change.split(' (now ')[0]}"
    return first


def _source_words(out: ScenarioAnswer, source: str) -> str:
    if source == "quality" and out.quality_decision in ("better", "worse"):
        more = "more" if out.quality_decision == "better" else "fewer"
        return f"quality ({out.recommended} passes {more} graded items than {out.baseline})"
    return LABELS[source]


def money(v: float | None, digits: int = 3) -> str:
    """Dollars to `digits` significant figures (cents from $1, whole dollars from $100, a power of ten from $1e9 and
    under $1e-4, never a 300-digit amount): the answer, every table and the page's calculator write amounts alike."""
    if v is None:
        return "–"
    if v == 0:
        return "$0"
    sign, v = ("-" if v < 0 else ""), abs(v)
    if v >= 1e9 or v < 1e-4:  # a power of ten beyond either end, as the page's calculator writes it
        mantissa, exponent = f"{v:.2e}".split("e")
        return f"{sign}${mantissa}e{int(exponent)}"
    if v >= 100:
        return f"{sign}${v:,.0f}"
    return f"{sign}${v:#.{digits}g}" if v < 1 else f"{sign}${v:.2f}"


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

"""The answer first: per cost scenario, which configuration to run, what an accepted task costs with it, what it
saves against the baseline, how sure that is, and from which value of the main inputs the choice matters.

Computed once here from the priced rows and their paired Monte Carlo samples (the verdicts of verdicts.py, no
second rule), and read by every output that ends a run: the terminal (report/terminal.py), `ledger.json` /
`--json`, and the HTML report.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Threshold(BaseModel):
    """Where moving one input alone (everything else as priced) changes the answer.

    `value` is where the verdict of verdicts.py changes (paired Monte Carlo, a difference only beyond 1% of the cost
    with a 95% interval); `low`/`high` bound where it may really change: the 2.5th and 97.5th percentiles, over the
    Monte Carlo samples, of the value at which that sample's costs cross (a bound is None when more than 2.5% of
    the samples do not cross within the searched range)."""

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
    change: str = ""  # the sentence: "decoding matters below 0.034 min (2 s) of review per task: lookup-w4 cheapest"


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

    def scenario(self, name: str) -> ScenarioAnswer:
        return next(s for s in self.scenarios if s.scenario == name)

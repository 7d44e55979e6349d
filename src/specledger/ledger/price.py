"""Price a run: every configuration at its best feasible load level, with uncertainty and verdicts."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from pydantic import BaseModel, Field
from scipy.stats import beta

from specledger.errors import BadInput
from specledger.ledger.attempts import attempts_source
from specledger.ledger.answer import Answer, link_scenarios, scenario_answer
from specledger.ledger.breakeven import BreakEven, break_even
from specledger.ledger.concurrency import ConcurrencyBreakEven, break_even_concurrency
from specledger.ledger.inputs import DEFAULT_COSTS, CostInputs, Resolved, central_values, load_inputs
from specledger.ledger.measurements import ConfigMeasurement, measurement_baselines, measurements_from_run
from specledger.ledger.cost_model import Breakdown, Case, objective_misses, replicas_needed
from specledger.ledger.montecarlo import simulate
from specledger.ledger.paired import paired_speedup
from specledger.records.pairing import speedup
from specledger.ledger.same_quality import QualityDecision, at_shared_quality, decide_all
from specledger.ledger.sensitivity import sensitivity
from specledger.ledger.verdicts import point_verdicts, tested_verdicts

SCHEMA_VERSION = 1
UNQUANTIZED_DTYPES = ("fp32", "bf16", "fp16")


class ConfigCost(BaseModel):
    """One configuration at one load level, priced."""

    name: str
    strategy: str
    model: str = ""
    precision: str = ""
    load: str = ""
    concurrency: int | None = None
    tok_s: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    tpot_p95: float | None = None
    e2e_p95: float | None = None
    tau: float | None = None
    speedup: float | None = None  # tok/s over autoregressive on the same model and precision, same load
    speedup_low: float | None = None  # paired bootstrap 95% interval (same prompts under both)
    speedup_high: float | None = None
    speedup_base: str | None = None  # the autoregressive configuration it is measured against
    pass_rate: float | None = None
    pass_low: float | None = None  # 95% interval of a measured pass rate (Jeffreys)
    pass_high: float | None = None
    pass_rate_source: str = ""  # "measured 124/272", "shared: ar-fp32's 124/272 (no quality difference shown)",
    # or "cost file"
    quality: str = ""  # the quality decision against the reference (ledger/same_quality.py): "reference", "same",
    # "not shown" (both priced at the reference's pass rate), "better", "worse" (its own), "untested", "" (ungraded)
    requests: int = 0  # sent at this level: completed + failed
    failed: int = 0  # failed after retries (each priced as a failed attempt)
    errors: dict[str, int] = Field(default_factory=dict)  # failed by kind
    device_seconds_per_call: float | None = None  # None: nothing measured to price
    replicas: float | None = None  # devices provisioned for the demand rate, when one is given
    cost_per_call: float | None = None
    per_million_tokens: float | None = None
    attempts: float | None = None
    escalation: float | None = None
    attempts_source: str = ""  # measured retries (ledger/attempts.py) or the formula, in words
    compute: float | None = None  # device cost of the attempts, energy included
    energy: float | None = None  # the energy part of compute (owned hardware: rent includes it)
    energy_j_per_task: float | None = None  # measured joules of an accepted task's attempts (None: not measured)
    energy_method: str = "unavailable"  # how they were had: a counter (rapl, nvml) or "estimated: ..."
    tools: float | None = None
    labour: float | None = None
    maintenance: float | None = None
    total: float | None = None  # None when infinite (see `infinite`) or when nothing was measured
    task_latency_s: float | None = None
    mean: float | None = None
    p5: float | None = None
    p95: float | None = None
    p_cheapest: float | None = None
    p_feasible: float | None = None
    feasible: bool = True
    misses: list[str] = Field(default_factory=list)
    comparable: bool = True
    comparable_reason: str = ""
    infinite: bool = False
    verdict: str = ""
    verdict_detail: str = ""

    @property
    def cost_shares(self) -> dict[str, float]:
        """Engine compute, tools (retrieval, tool calls), labour, maintenance and energy, as shares of the total:
        what the decoding choice can move (the engine's part, its energy) apart from what it cannot."""
        if self.infinite or not self.total or self.compute is None:
            return {}
        energy = self.energy or 0.0
        parts = {"engine": self.compute - energy, "tools": self.tools, "labour": self.labour,
                 "maintenance": self.maintenance, "energy": energy}
        return {k: (v or 0.0) / self.total for k, v in parts.items()}


class LedgerResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_dir: str = ""
    inputs_source: str = ""
    reference: str | None = None
    configs: list[ConfigCost]  # one row per configuration: its priced load level
    levels: list[ConfigCost]  # every configuration x load level
    break_even: list[BreakEven] = Field(default_factory=list)
    # each speculative configuration's speed-up along the concurrency sweep and where it stops paying
    concurrency: list[ConcurrencyBreakEven] = Field(default_factory=list)
    # the quality decision of each configuration against the reference, made once: QualityDecision's fields
    # (ledger/same_quality.py: paired exact McNemar, non-inferiority margin; `priced_at` says which pass rate)
    quality: list[dict] = Field(default_factory=list)
    scenario: str | None = None  # the headline scenario these rows price (when the cost file names scenarios)
    scenarios: dict[str, list[dict]] = Field(default_factory=dict)  # the other scenarios, one summary per row
    sensitivity: dict[str, list[dict]] = Field(default_factory=dict)
    samples: int = 0
    seed: int = 0
    measurements: list[ConfigMeasurement] = Field(default_factory=list)
    calculator: dict = Field(default_factory=dict)  # what the page's calculator starts from (with scenarios: each one's inputs)
    answer: Answer | None = None  # the decision per scenario, shown before everything else (ledger/answer.py)

    def config(self, name: str) -> ConfigCost:
        return next(c for c in self.configs if c.name == name)


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


# what a priced row repeats of its measurement, field for field
_SAME = ("name", "strategy", "model", "precision", "load", "concurrency", "errors", "comparable", "comparable_reason")
_MEASURED = ("tok_s", "ttft_p50", "ttft_p95", "tpot_p95", "e2e_p95", "tau")


def _cost_row(m: ConfigMeasurement, case: Case, b: Breakdown, misses: list[str], source: str) -> ConfigCost:
    demand = case.x["volume"]["demand_rps"]
    low = high = None
    if source != "cost file" and m.graded:
        low, high = (float(v) for v in beta.ppf([0.025, 0.975], m.passes + 0.5, m.graded - m.passes + 0.5))
    per_call_j = case.op.energy_j_per_call
    energy_j = None if per_call_j is None else float(b.attempts * case.x["task"]["calls_per_task"] * per_call_j)
    return ConfigCost(**{k: getattr(m, k) for k in _SAME + _MEASURED}, pass_low=low, pass_high=high,
        energy_j_per_task=energy_j, energy_method=m.energy_method, pass_rate=float(b.pass_rate),
        pass_rate_source=source, requests=m.requests_completed + m.requests_failed, failed=m.requests_failed,
        device_seconds_per_call=case.op.device_seconds_per_call,
        replicas=None if demand is None else float(replicas_needed(demand, case.op.requests_per_s, case.op.device_count)),
        cost_per_call=float(b.cost_per_call), per_million_tokens=_finite(b.per_million_tokens),
        attempts=float(b.attempts), escalation=float(b.escalation), attempts_source=attempts_source(m), compute=float(b.compute), energy=float(b.energy),
        tools=float(b.tools),
        labour=float(b.labour), maintenance=float(b.maintenance), total=_finite(b.total),
        task_latency_s=b.task_latency_s, feasible=not misses, misses=misses, infinite=b.infinite,
    )


def _case(m: ConfigMeasurement, res: Resolved, inputs: CostInputs, sweep: list[tuple[float, float]],
          quality: QualityDecision | None = None) -> tuple[Case, str]:
    """`quality`: m's decision against the reference (the pass rate priced: its own, borrowed, or shared)."""
    x = res.central()
    op = m.operating_point(x["hardware"]["device_count"])
    if x["acceptance"]["pass_rate"] is not None:
        source = "cost file"
    elif m.graded:
        failed = f", {m.requests_failed} failed" if m.requests_failed else ""
        counts = f"{m.passes:g}/{m.graded}{failed}"
        borrowed = quality is not None and quality.grades_from != m.name
        if quality is not None and quality.shared and quality.grades_from != quality.config_a:
            source = f"shared: {quality.config_a}'s {counts} (no quality difference shown)"
        elif borrowed and quality is not None:  # lossless speculation: its target's graded answers are its own
            source = f"borrowed: {quality.grades_from if not quality.shared else quality.config_a}'s {counts} (lossless)"
        else:
            source = f"measured {counts}"
    else:  # never send the user to edit the installed package's defaults
        where = (f"in {inputs.source}" if not inputs.source.startswith(str(DEFAULT_COSTS)) else
                 "in a cost file (`specledger cost --init cost.yaml` writes one) and pass it with --inputs cost.yaml")
        raise BadInput(
            f"{m.name}: no graded requests, so no measured pass rate; set configs.{m.name}.acceptance.pass_rate "
            f"(or acceptance.pass_rate) {where}, or benchmark a workload with reference answers"
        )
    return Case(m.name, x, op, sweep, m.concurrency), source


def _reference(ms: list[ConfigMeasurement]) -> str | None:
    """The autoregressive configuration on fp32, else bf16, else fp16, else any; else the first configuration."""
    ar = [m.name for p in UNQUANTIZED_DTYPES for m in ms if m.strategy == "ar" and m.precision == p]
    return next(iter(ar + [m.name for m in ms if m.strategy == "ar"] + [m.name for m in ms]), None)


def speedups(ms: list[ConfigMeasurement]) -> dict[tuple[str, str], float]:
    """(config, load) -> tok/s over its autoregressive baseline (records/pairing.py) at that load."""
    pairs = measurement_baselines(ms)
    tok_s = {(m.name, m.load): m.tok_s for m in ms}
    out = {}
    for m in ms:
        if (up := speedup(m.tok_s, tok_s.get((pairs.get(m.name, ""), m.load)))) is not None:
            out[(m.name, m.load)] = up
    return out


def at_same_quality(ms: list[ConfigMeasurement]) -> tuple[list[ConfigMeasurement], str | None,
                                                           dict[str, QualityDecision]]:
    """The measurements as priced (ledger/same_quality.py: where the paired test shows no quality difference, the
    reference's graded items), the reference, and each configuration's quality decision."""
    ref = _reference([m for m in ms if m.requests_completed > 0])
    decisions = decide_all(ms, ref)
    return at_shared_quality(ms, decisions, ref), ref, decisions


def choose_levels(ms: list[ConfigMeasurement], inputs: CostInputs, decisions: dict[str, QualityDecision] | None = None):
    """Price every load level; per configuration keep its cheapest feasible level (else its least-missing one).
    `decisions` (at_same_quality's) label the pass rates priced at the reference's."""
    names = list(dict.fromkeys(m.name for m in ms))
    unknown = sorted(set(inputs.overrides) - set(names))
    if unknown:
        raise BadInput(f"{inputs.source}: configs.{unknown[0]}: no configuration of that name in the run (have: {', '.join(names)})")
    by_name: dict[str, list[ConfigMeasurement]] = defaultdict(list)
    for m in ms:
        by_name[m.name].append(m)
    ups = speedups(ms)
    levels: list[ConfigCost] = []
    chosen: list[tuple[ConfigCost, Case | None, Resolved, ConfigMeasurement]] = []  # None: nothing to price
    for name in names:
        res = inputs.resolve(name)
        group = [m for m in by_name[name] if m.requests_completed > 0]
        if not group:  # every request failed: a row that says so, nothing to price
            m = by_name[name][0]
            failed = sum(x.requests_failed for x in by_name[name])
            row = ConfigCost(**{k: getattr(m, k) for k in _SAME}, requests=failed, failed=failed, feasible=False,
                             misses=[f"no completed requests ({failed} failed)"])
            levels.append(row)
            chosen.append((row, None, res, m))
            continue
        sweep = sorted((float(m.concurrency), m.requests_per_s) for m in group if m.concurrency is not None)
        options = []
        for m in group:
            case, source = _case(m, res, inputs, sweep, (decisions or {}).get(name))
            b = case.cost()
            row = _cost_row(m, case, b, objective_misses(case.x, case.op), source)
            row.speedup = ups.get((m.name, m.load))
            levels.append(row)
            options.append((row, case, m))
        feasible = [o for o in options if o[0].feasible]
        pick = min(feasible, key=lambda o: (o[0].total is None, o[0].total or 0.0)) if feasible else \
            min(options, key=lambda o: (len(o[0].misses), o[2].concurrency or 0))
        chosen.append((pick[0], pick[1], res, pick[2]))
    return levels, chosen


def cases_for(run_dir: str | Path, inputs: CostInputs | str | Path | None = None) -> dict[str, Case]:
    """The priced Case of every configuration of a run (for break-even questions)."""
    if not isinstance(inputs, CostInputs):
        inputs = load_inputs(inputs)
    if inputs.scenarios:  # the headline scenario
        inputs = inputs.scenario(next(iter(inputs.scenarios)))
    ms, _, decisions = at_same_quality(measurements_from_run(run_dir))
    _, chosen = choose_levels(ms, inputs, decisions)
    return {row.name: case for row, case, _, _ in chosen if case is not None}


def price_measurements(ms: list[ConfigMeasurement], inputs: CostInputs, *, samples: int = 2000, seed: int = 0,
                       run_dir: str = "", scenario: str = "", thresholds: bool = True) -> LedgerResult:
    """Point costs, verdicts, Monte Carlo intervals, break-evens and sensitivity for a set of measurements, and the
    answer first (ledger/answer.py). With scenarios in the cost file, the first is priced in full and the others
    summarised; the answer has one entry per scenario. `thresholds=False` skips the answer's threshold search and
    curve (a second or two per scenario: for callers that price many times and read only the verdicts)."""
    if inputs.scenarios:
        names = list(inputs.scenarios)
        out = price_measurements(ms, inputs.scenario(names[0]), samples=samples, seed=seed, run_dir=run_dir,
                                 scenario=names[0], thresholds=thresholds)
        out.scenario, out.inputs_source = names[0], inputs.source
        for name in names[1:]:
            other = price_measurements(ms, inputs.scenario(name), samples=min(samples, 1000), seed=seed, scenario=name,
                                       thresholds=thresholds)
            out.scenarios[name] = [_summary(r) for r in other.configs]
            if out.answer is not None and other.answer is not None:
                out.answer.scenarios += other.answer.scenarios
        if out.answer is not None:
            link_scenarios(out.answer)
        out.calculator["scenarios"] = {name: inputs.scenario(name).base.central() for name in names}
        return out
    measured = ms
    ms, ref, decisions = at_same_quality(ms)
    levels, all_chosen = choose_levels(ms, inputs, decisions)
    rows = [c[0] for c in all_chosen]
    for r in levels:
        d = decisions.get(r.name)
        r.quality = "reference" if r.name == ref and r.pass_rate_source != "cost file" else "" if d is None else d.decision
        if d is not None and r.pass_rate_source == "cost file":
            d.priced_at = "cost file"
    point_verdicts(rows)
    chosen = [(row, case, res, m) for row, case, res, m in all_chosen if case is not None]
    eligible = {r.name for r in rows if r.verdict in ("cheapest", "dominated", "trade-off")}
    cost_samples = None
    if samples > 0:
        mc = simulate([(case, res, m) for _, case, res, m in chosen], eligible=eligible, samples=samples, seed=seed)
        for r in (r for r in rows if r.name in mc):
            i = mc[r.name]
            r.mean, r.p5, r.p95 = _finite(i.mean), _finite(i.p5), _finite(i.p95)
            r.p_feasible = i.p_feasible
            r.p_cheapest = i.p_cheapest if r.name in eligible else None
        cost_samples = {n: i.costs for n, i in mc.items() if i.costs is not None}
        tested_verdicts(rows, cost_samples)
    _paired_speedups(levels, ms, seed=seed)  # (each priced row is one of `levels`, the same object)

    # thresholds need the Monte Carlo: without samples (point estimates) the answer has none
    answer = Answer(scenarios=[scenario_answer(scenario, rows, chosen, ref, cost_samples, samples=samples, seed=seed,
                                               thresholds=thresholds and samples > 0, quality=decisions)])
    sens = {}
    for row, case, res, m in chosen:
        if row.total is not None:
            sens[row.name] = [asdict(s) | {"swing": s.swing} for s in sensitivity(case, res, m, seed=seed)]
    bes = _default_break_evens(chosen, ref)
    quality = [d.model_dump() for d in decisions.values()]

    calculator = {
        "base": inputs.base.central(),
        "overrides": {name: central_values(over) for name, over in inputs.overrides.items()},
        "configs": [
            {"name": r.name, "load": r.load, "strategy": r.strategy, "precision": r.precision,
             "comparable": r.comparable, "comparable_reason": r.comparable_reason,
             "tok_s": r.tok_s, "tau": r.tau, "quality": r.quality, "pass_rate_source": r.pass_rate_source,
             "op": asdict(case.op),
             # every measured level at the run's device count: the page re-chooses the level on each edit
             "levels": [{"load": lm.load, "concurrency": lm.concurrency, "op": asdict(lm.operating_point())}
                        for lm in ms if lm.name == r.name and lm.requests_completed > 0]}
            for r, case, _, _ in chosen
        ],
    }
    return LedgerResult(
        run_dir=str(run_dir), inputs_source=inputs.source, reference=ref, configs=rows, levels=levels,
        break_even=bes, concurrency=break_even_concurrency(levels), quality=quality, sensitivity=sens, samples=samples, seed=seed, measurements=measured, calculator=calculator,
        answer=answer,
    )


def _summary(r: ConfigCost) -> dict:
    s = r.cost_shares  # compute_share: the engine's compute, its energy and the tool calls, as the cost table had it
    return {"name": r.name, "load": r.load, "total": r.total, "p5": r.p5, "p95": r.p95, "verdict": r.verdict,
            "verdict_detail": r.verdict_detail, "compute_share": s["engine"] + s["energy"] + s["tools"] if s else None,
            "labour_share": None} | {f"{k}_share": v for k, v in s.items()}


def _occupancy(m: ConfigMeasurement) -> float | None:
    """Requests in service at once, on average: summed service time over the level's device time (1 when one
    request is served at a time; about the batch size when continuously batched)."""
    svc = sum(q.service_s for q in m.requests if q.service_s)
    return svc / m.wall_s if svc > 0 and m.wall_s > 0 else None


def _paired_speedups(rows: list[ConfigCost], ms: list[ConfigMeasurement], *, seed: int) -> None:
    """Each level's speed-up with its paired interval: the same prompts under the configuration and its
    autoregressive base at the same load. Per prompt, tokens over service seconds; scaled by each side's
    occupancy so that the point is the ratio of aggregate throughputs at any concurrency (a batched request's
    service time is shared with the batch; a queued one's is not)."""
    by_level = {(m.name, m.load): m for m in ms}
    pairs = measurement_baselines(ms)
    for r in rows:
        m = by_level.get((r.name, r.load))
        if m is None or r.speedup is None or pairs.get(m.name, m.name) == m.name:
            continue
        base = by_level.get((pairs[m.name], m.load))
        if base is None or not base.tok_s:
            continue
        pr = paired_speedup({q.key: (q.service_s, q.output_tokens) for q in m.requests if q.key and q.service_s},
                            {q.key: (q.service_s, q.output_tokens) for q in base.requests if q.key and q.service_s},
                            seed=seed)
        ka, kb = _occupancy(m), _occupancy(base)
        if pr.ratio is None or ka is None or kb is None:
            continue
        k = ka / kb
        r.speedup, r.speedup_base = pr.ratio * k, base.name
        r.speedup_low = None if pr.low is None else pr.low * k
        r.speedup_high = None if pr.high is None else pr.high * k


def _plausible(b: BreakEven) -> bool:
    """A crossing inside the range where the input could really be: a pass rate of at least 5%, a price,
    wage or time within 10x of today's (break_even's default bounds already stop at 10x)."""
    if b.value is None:
        return False
    if b.field == "pass_rate":
        return 0.05 <= b.value <= 1.0
    return b.current is None or b.current == 0 or b.current / 10 <= b.value <= b.current * 10


def _default_break_evens(chosen, ref: str | None) -> list[BreakEven]:
    """Against the reference: how far may each configuration's pass rate drop (or prices, wages move).
    Only crossings in a plausible range; none on the pass rate for identical outputs (their quality is the
    same by construction, so a crossing there only restates the noise in the cost)."""
    cases = {row.name: (row, case) for row, case, _, _ in chosen}
    ms_of = {m.name: m for _, _, _, m in chosen}
    if ref not in cases:
        return []
    ref_row, ref_case = cases[ref]
    if ref_row.total is None:
        return []
    price_field = "hardware.price_per_device_hour" if ref_case.x["hardware"]["kind"] == "rented" else "hardware.purchase_price"
    out = []
    for name, (row, case) in cases.items():
        if name == ref or row.total is None or not row.comparable:
            continue
        same_outputs = ms_of[name].outputs is not None and ms_of[name].outputs == ms_of[ref].outputs
        fields = ([] if same_outputs else ["pass_rate"]) + [price_field, "acceptance.wage_per_hour",
                                                            "acceptance.fix_minutes"]
        if len(case.sweep) >= 2:
            fields.append("concurrency")
        for f in fields:
            try:
                b = break_even(case, ref_case, f)
            except BadInput:
                continue
            if _plausible(b):
                out.append(b)
    return out


def price_run(run_dir: str | Path, inputs: CostInputs | str | Path | None = None, *, samples: int = 2000,
              seed: int = 0, thresholds: bool = True) -> LedgerResult:
    """Read a harness results directory and price every configuration in it."""
    if not isinstance(inputs, CostInputs):
        inputs = load_inputs(inputs)
    return price_measurements(measurements_from_run(run_dir), inputs, samples=samples, seed=seed, run_dir=str(run_dir),
                              thresholds=thresholds)

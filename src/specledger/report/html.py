"""The self-contained HTML report: tables, inline SVG charts, and the calculator (inline JS, no network)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import escape

from specledger.records import durable
from specledger.records.results import RunResult, SteadyState, kind_passes, load_run, thread_choice_text
from specledger.ledger.answer import Answer, ScenarioAnswer, _tied_words as tied_words
from specledger.ledger.price import ConfigCost, LedgerResult
from specledger.ledger.verdicts import MATERIAL
from specledger.quality.graders import GRADING_NOTE
from specledger.report.attempts import attempts_rows
from specledger.report import charts, evidence
from specledger.report.interaction import interaction_grid, interaction_rows
from specledger.report.positions import position_table
from specledger.report.terminal import break_even_cell, concurrency_sweep, failed_cell, money, num, saving_sources_text

ASSETS = Path(__file__).with_name("assets")
SHARE_NAMES = ("engine", "tools", "labour", "maintenance", "energy")  # the ledger's cost split (cost_shares)


def chart_sections(first: str) -> list[tuple[str, str, str]]:
    """(chart key, title naming its load level, what is said when the run has no such chart)."""
    return [
        ("speedup_by_kind", f"Speed-up by task kind — {first}",
         "No speculative configuration has an autoregressive baseline on the same precision."),
        ("tau_by_kind", f"τ by task kind — {first}", "No configuration reported verification steps."),
        ("latency", f"Latency distributions (TTFT, TPOT; dotted line: p95) — {first}; n = requests per line",
         "The run has no per-request latencies."),
        ("ttft_length", f"Time to first token vs prompt length — {first}",
         "The run's prompts have one length (`specledger bench --input-tokens 1024,4096,16384` sweeps it)."),
        ("concurrency", "Throughput and speed-up vs concurrency (every measured level)", "The run did not sweep concurrency."),
        ("verify_curves", "Verification cost of the target: forward time vs tokens verified — one sequence, no "
         "concurrency (a probe describing the target; no decision reads it: the adaptive planner sizes drafts on "
         "its own cost surface, measured on batched passes)",
         "This run recorded no verification-cost curve (forward time for k tokens per configuration)."),
    ]


def first_level_words(ledger: LedgerResult) -> str:
    """Which load the per-kind charts, latency charts and interaction table use (each configuration's lowest)."""
    loads = sorted({m.load for m in charts.first_level(ledger.measurements)})
    priced = sorted({r.load for r in ledger.configs if r.load})
    words = f"at {' / '.join(loads)} (each configuration's lowest load)" if loads else "at each configuration's lowest load"
    if priced and priced != loads:
        words += f"; the cost table prices {' / '.join(priced)}"
    return words


def _shares(s: Mapping[str, float | None]) -> str:
    """The five-way split as percentages without their signs (the column header says %): "0 · 1 · 98 · 1 · 0"."""
    if not s or any(s.get(k) is None for k in SHARE_NAMES):
        return "–"
    return " · ".join(f"{100 * (s[k] or 0.0):.0f}" for k in SHARE_NAMES)


def _row(r: ConfigCost, n: int | None) -> dict:
    s = r.cost_shares
    return {
        "name": r.name, "precision": r.precision, "load": r.load, "tok_s": num(r.tok_s, ".1f"),
        "speedup": _speedup(r), "ttft": f"{num(r.ttft_p50, '.2f')} / {num(r.ttft_p95, '.2f')} (n={n or 0})",
        "tau": num(r.tau, ".2f"), "pass_rate": f"{num(r.pass_rate, '.0%')}" + ("" if r.pass_low is None else
                                                      f" [{r.pass_low:.0%}–{r.pass_high:.0%}]")
        + f" ({r.pass_rate_source})",
        "failed": failed_cell(r),
        "per_m": money(r.per_million_tokens), "total": "∞" if r.infinite else money(r.total),
        "total_raw": "inf" if r.infinite else ("" if r.total is None else repr(r.total)),
        "interval": "–" if r.p5 is None else f"{money(r.mean)} [{money(r.p5)}–{money(r.p95)}]",
        "p_cheapest": num(r.p_cheapest, ".0%"),
        "shares": _shares(s),
        "verdict": r.verdict, "verdict_detail": r.verdict_detail,
    }


def _interaction_cell(h: dict) -> str:
    ref = "" if h["vs_reference"] is None else f" · {h['vs_reference']:.2f}× vs ref."
    flag = "" if h["comparable"] else ", not comparable"
    return f"{h['speedup']:.2f}×{ref} <span class=\"note\">{escape(h['name'])}{flag}</span>"


def _interaction_table(rows: list[dict]) -> tuple[list[str], list[dict]]:
    precisions, grid = interaction_grid(rows)
    return precisions, [{"method": "autoregressive (quantization alone)" if s == "ar" else s,
                         "cells": ["<br>".join(map(_interaction_cell, hits)) or '<span class="note">not measured</span>'
                                   for hits in cells]} for s, cells in grid]


def _speedup(r: ConfigCost) -> str:
    """"1.23× [1.10–1.35]": the speed-up and its paired interval, where measured."""
    return num(r.speedup, ".2f", "×") + ("" if r.speedup_low is None else f" [{r.speedup_low:.2f}–{r.speedup_high:.2f}]")


def _concurrency_table(ledger: LedgerResult) -> dict | None:
    """Every swept configuration: tok/s and paired speed-up at each concurrency, and where it stops paying."""
    levels, swept = concurrency_sweep(ledger)
    if not swept:
        return None
    rows = []
    for first, at, b in swept:
        cells = ["–" if r is None else f"{r.tok_s:.1f} tok/s" + (
                 "" if r.speedup is None or r.strategy == "ar" else f" · {_speedup(r)}") for r in at]
        rows.append({"name": first.name, "strategy": first.strategy, "precision": first.precision, "cells": cells,
                     "break_even": "baseline" if first.strategy == "ar" else
                     (break_even_cell(b).replace("\n[dim]", " (").replace("[/dim]", ")") if b else "–"),
                     "note": b.note if b else ""})
    return {"levels": levels, "rows": rows}


def _load(run_dir: str | Path) -> RunResult | None:
    """The run's run.json, read once for every section that needs it; the report still renders from the ledger
    alone when it is missing or unreadable."""
    try:
        return load_run(run_dir)
    except Exception:
        return None


def _noise(run: RunResult | None) -> dict | None:
    """The run's calibration probes and, past the threshold, the warning naming the cause."""
    if run is None or run.noise is None:
        return None
    n = run.noise
    probes = ", ".join(f"{p.when} {p.ms:.2f} ms" + (f" (load {p.load_avg[0]:g})" if p.load_avg else "")
                       for p in n.probes)
    return {"warning": n.warning, "probes": probes, "drift": num(n.drift, ".0%"),
            "threads": ", ".join(f"{k} {v}" for k, v in n.threads.items()),
            "chosen": thread_choice_text(n.thread_choice) if n.thread_choice is not None else None,
            "interleaved": run.conditions.interleaved}


def _energy(ledger: LedgerResult) -> list[dict]:
    """Energy per request and per accepted task, each with its method, for every priced row that measured it."""
    out = []
    for r in ledger.configs:
        if r.energy_j_per_task is None:
            continue
        m = next((m for m in ledger.measurements if m.name == r.name and m.load == r.load), None)
        # operating_point() builds point values from the measurement (no Monte Carlo draws)
        per_req = cast(float | None, m.operating_point().energy_j_per_call) if m is not None else None
        out.append({"name": r.name, "load": r.load, "per_request": num(per_req, ".3g", " J"),
                    "per_task": num(r.energy_j_per_task, ".3g", " J"),
                    "wh_per_1000": num(r.energy_j_per_task / 3.6, ".3g", " Wh"),
                    "method": r.energy_method})
    return out


def _steady(run: RunResult | None) -> dict | None:
    """Levels held for steady state: their windows (for the chart) and which ended before settling."""
    if run is None:
        return None
    levels = [(f"{c.name} @{lr.load}", lr.steady_state) for c in run.configs for lr in c.loads if lr.steady_state]
    if not levels:
        return None
    rows = [{"label": label, "burst": num(ss.burst_tok_s, ".1f"), "steady": num(ss.steady_tok_s, ".1f"),
             "ratio": num(ss.steady_tok_s / ss.burst_tok_s if ss.steady_tok_s and ss.burst_tok_s else None, ".2f",
                         "×"),
             "after": num(ss.time_to_steady_s, ".3g", " s"), "reached": ss.reached, "windows": len(ss.windows_tok_s),
             "window": ss.window} for label, ss in levels]
    return {"chart": charts.steady_state(levels), "rows": rows,
            "unsettled": [r["label"] for r in rows if not r["reached"]],
            "unexposed": unexposed([ss for _, ss in levels], gpu=bool(run.conditions.gpu)),
            "throttled": sorted({why for _, ss in levels for x in ss.samples for bit, why in
                                 charts.GPU_THROTTLING.items() if (x.gpu_throttle or 0) & bit})}


def unexposed(held: list[SteadyState], *, gpu: bool) -> list[str]:
    """The machine's conditions no sample of these levels could read (said once, not drawn as empty panels);
    the GPU's only on a run that had one."""
    samples = [x for ss in held for x in ss.samples]
    wanted = {"CPU frequency": ("cpu_mhz",), "temperature": ("cpu_temp_c", "gpu_temp_c")}
    if gpu:
        wanted |= {"GPU clocks": ("gpu_sm_mhz",), "GPU throttle reasons": ("gpu_throttle",)}
    return [what for what, fields in wanted.items()
            if not any(getattr(x, f) is not None for x in samples for f in fields)]


def _conditions(run: RunResult | None, run_dir: str | Path) -> tuple[str, str, str]:
    """Run id, creation time and a one-line description of the machine, when run.json is readable."""
    if run is None:
        return Path(str(run_dir)).name or "run", "", ""
    c = run.conditions
    bits = [b for b in (c.cpu_model, f"{c.cpu_count} CPUs" if c.cpu_count else None, c.gpu,
                        f"torch {c.torch}" if c.torch else None, f"products: {c.kernel}" if c.kernel else None,
                        f"energy: {c.energy}") if b]
    return run.run_id, run.created.strftime("%Y-%m-%d %H:%M UTC"), " · ".join(bits)


def _workload(run: RunResult | None) -> dict | None:
    """The run's workload: format, what was read and skipped per kind, how each kind is graded."""
    w = run.workload if run is not None else None
    if run is None or w is None:
        return None
    kinds = sorted(set(w.by_kind) | set(w.skipped) | set(w.grading))
    user = all(g.startswith("user grader") for g in w.grading.values())
    return {"info": w, "spec": evidence.public_name(w.spec), "skipped_total": sum(w.skipped.values()),
            "note": "" if user else GRADING_NOTE,
            "rows": [{"kind": k, "questions": w.by_kind.get(k, 0), "with_reference": w.with_reference.get(k, 0),
                      "skipped": w.skipped.get(k, 0), "grading": w.grading.get(k, "–"),
                      "passes": kind_passes(run, k) or "–"} for k in kinds]}


def _json_for_script(obj: object) -> str:
    text = json.dumps(obj, allow_nan=False, default=lambda o: None)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def _clean(obj: object) -> object:
    """JSON has no Infinity/NaN: the page treats null as 'not available'."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def _fallback_answer(ledger: LedgerResult) -> Answer:
    """Without the ledger's answer block (a ledger.json written before it existed): the headline scenario's
    recommendation as the verdicts give it, and nothing the ledger did not compute."""
    rows = [r for r in ledger.configs if r.verdict in ("cheapest", "indistinguishable") and r.total is not None]
    best = min(rows, key=lambda r: (r.verdict != "cheapest", r.total or 0.0), default=None)
    if best is None:
        return Answer(scenarios=[ScenarioAnswer(scenario=ledger.scenario or "")])
    tied = [r.name for r in rows if r.verdict == "indistinguishable" and r is not best]
    return Answer(scenarios=[ScenarioAnswer(
        scenario=ledger.scenario or "", recommended=best.name, verdict=best.verdict, tied_with=tied, cost=best.total,
        cost_low=best.p5, cost_high=best.p95, tie=bool(tied) and len(tied) + 1 == len(rows),
        confidence="the ledger computed no answer block for this file: " + (best.verdict_detail or best.verdict))])


def _money_range(lo: float | None, hi: float | None) -> str:
    return "" if lo is None or hi is None else f"{money(lo)} to {money(hi)}"


def _curve_note(sa: ScenarioAnswer) -> str:
    """What the answer chart marks, in words (and when it has no threshold to mark)."""
    th = next((t for t in sa.thresholds if t.input == sa.curve_input), None)
    shaded = " (shaded: its 95% interval)" if charts.threshold_band(sa) is not None else ""
    where = (f"dashed: where the answer changes{shaded}" if th is not None and th.value is not None
             else "no threshold within the searched range" if th is None else
             f"no threshold: {th.change or 'the answer does not change in the searched range'}")
    return (f"Cost per accepted task against review minutes, one line per configuration (the recommendation thickest; "
            f"lines that coincide are drawn and named once), "
            f"everything else as priced; dotted: today's value; {where}.")


def answer_cards(ledger: LedgerResult) -> list[dict]:
    """The answer block: one card per scenario, the headline scenario first (ledger/answer.py's Answer)."""
    answer = ledger.answer or _fallback_answer(ledger)
    cards = []
    for sa in answer.scenarios:
        saving = None
        if sa.recommended and sa.baseline:
            if sa.recommended == sa.baseline:
                saving = f"It is the baseline ({sa.baseline}): nothing to save against it."
            elif sa.saving_per_month is not None:
                rng = _money_range(sa.saving_low, sa.saving_high)
                amount = (f"{money(abs(sa.saving_per_month))} a month" + (f" (95%: {rng})" if rng else "")
                          + (f", {money(abs(sa.saving_per_task))} per task" if sa.saving_per_task is not None else "")
                          + (f" at {sa.tasks_per_month:,.0f} tasks a month" if sa.tasks_per_month else ""))
                less = "less" if sa.saving_per_month >= 0 else "more"
                # a difference the headline does not claim (a tie: within the 1% margin) is not called a saving
                saving = (f"{'Saves' if less == 'less' else 'Costs'} {amount} against {sa.baseline}." if sa.saving_from
                          or not sa.sources and not sa.tie else
                          f"Against {sa.baseline}: {amount} {less}, not claimed as a saving (" + (
                              f"they cost the same within {MATERIAL:.0%} of the cost per task" if sa.tie else
                              "no source carries it with evidence") + ").")
        shares = " · ".join(f"{k} {sa.shares[k]:.0%}" for k in SHARE_NAMES if k in sa.shares)
        # the saving by source, each with its 95% interval; the headline names those with evidence (saving_from)
        sources = saving_sources_text(sa.sources) if sa.sources and sa.recommended != sa.baseline else ""
        human = None
        if sa.human_cost is not None:
            mine = next((h for h in sa.human if h.config == sa.recommended), None)
            human = f"A person doing the task costs {money(sa.human_cost)}" + (
                "" if mine is None or mine.ratio is None else f"; {sa.recommended} costs {mine.ratio:.2g}× that") + "."
        cards.append({
            "scenario": sa.scenario, "recommended": sa.recommended, "verdict": sa.verdict, "headline": sa.headline,
            "cost": money(sa.cost) if sa.cost is not None else "–",
            "interval": _money_range(sa.cost_low, sa.cost_high), "saving": saving, "confidence": sa.confidence,
            "tied_with": sa.tied_with, "tie": sa.tie, "tie_reason": sa.tie_reason, "shares": shares, "human": human,
            "tied": tied_words(sa.tied) if sa.tied else "", "sources": sources,
            "saving_from": " and ".join(sa.saving_from), "quality": sa.quality,
            # each threshold's sentence is the ledger's (ledger/answer.py: threshold_model, its interval in it)
            "thresholds": [t.change for t in sa.thresholds if t.value is not None],
            "no_change": [t.change for t in sa.thresholds if t.value is None] + [f"not searched: {n}" for n in sa.not_searched],
            "chart": charts.answer_curve(sa), "chart_note": _curve_note(sa),
        })
    return cards


def scrub(html: str, paths: list[str | Path]) -> str:
    """No absolute path of this machine in the report: each of `paths` (the run directory, the package, the working
    directory, home), where it still occurs in a message, is cut back to what follows it."""
    for p in sorted({str(Path(x).expanduser().resolve()) for x in paths if str(x)} - {"/"}, key=len, reverse=True):
        html = re.sub(r"(?<![\w.~-])" + re.escape(p) + r"(/|(?![\w-]|\.\w))", lambda m: "" if m[1] else ".", html)
    return html


def render_report(ledger: LedgerResult, run_dir: str | Path | None = None, out_dir: str | Path | None = None) -> str:
    """The report as one HTML string; `out_dir` is where it will be written (the run's files are linked relative
    to it; default: the run directory)."""
    rdir = Path(run_dir or ledger.run_dir)
    run = _load(rdir)
    run_id, created, conditions = _conditions(run, rdir)
    odir = Path(out_dir) if out_dir is not None else None
    cheapest = next((r.name for r in ledger.configs if r.verdict == "cheapest"), None)
    recommended = ledger.answer.scenarios[0].recommended if ledger.answer and ledger.answer.scenarios else None
    tornado_config = recommended or cheapest or next((r.name for r in ledger.configs if r.total is not None), None)
    inter = interaction_rows(ledger)
    precisions, inter_table = _interaction_table(inter)
    figs = {"tornado": charts.tornado(ledger, tornado_config) if tornado_config else None,
            "interaction": charts.interaction(inter), "speedup_by_kind": charts.speedup_by_kind(ledger),
            "tau_by_kind": charts.tau_by_kind(ledger), "latency": charts.latency_distributions(ledger),
            "concurrency": charts.concurrency_sweep(ledger), "verify_curves": charts.verify_curves(ledger),
            "ttft_length": charts.ttft_by_input_length(ledger)}
    # (configuration, load) -> the requests its latency percentiles rest on
    ns = {(m.name, m.load): sum(1 for q in m.requests if q.ttft_s is not None) for m in ledger.measurements}
    levels = [{"name": r.name, "load": r.load, "n": ns.get((r.name, r.load), 0), "tok_s": num(r.tok_s, ".1f"),
               "speedup": num(r.speedup, ".2f", "×"), "ttft_p95": num(r.ttft_p95, ".2f"),
               "tpot_p95": num(r.tpot_p95, ".3f"), "dsec": num(r.device_seconds_per_call, ".3g"),
               "failed": failed_cell(r), "total": "∞" if r.infinite else money(r.total),
               "objectives": "met" if r.feasible else "; ".join(r.misses)}
              for r in ledger.levels] if len(ledger.levels) > len(ledger.configs) else []
    load_of = {r.name: r.load for r in ledger.configs}
    break_even = [{"load": f"{load_of.get(b.config_a, '?')} vs {load_of.get(b.config_b, '?')}", "config_a": b.config_a, "config_b": b.config_b, "field": b.field, "current": num(b.current, ".4g"),
                   "value": num(b.value, ".4g"), "note": b.note} for b in ledger.break_even]
    env = Environment(loader=FileSystemLoader(str(ASSETS)), autoescape=select_autoescape(["html", "j2"]))
    html = env.get_template("report.html.j2").render(
        title=Path(str(ledger.run_dir)).name or run_id, run_id=run_id, created=created, conditions=conditions,
        ledger=ledger, rows=[_row(r, ns.get((r.name, r.load))) for r in ledger.configs], levels=levels, break_even=break_even,
        noise=_noise(run), concurrency=_concurrency_table(ledger),
        energy=_energy(ledger), steady=_steady(run),
        scenarios={name: [{"name": r["name"], "load": r.get("load", ""), "total": money(r["total"]) if r["total"] is not None else "–",
                           "interval": "–" if r["p5"] is None else f"{money(r['p5'])}–{money(r['p95'])}",
                           "shares": _shares({k: r.get(f"{k}_share") for k in SHARE_NAMES}), "verdict": r["verdict"],
                           "verdict_detail": r["verdict_detail"]} for r in rows]
                   for name, rows in ledger.scenarios.items()},
        charts=figs, tornado_config=tornado_config, answer=answer_cards(ledger), material=f"{MATERIAL:.0%}",
        tornado_load=next((r.load for r in ledger.configs if r.name == tornado_config), ""), chart_sections=chart_sections(first_level_words(ledger)), first_level=first_level_words(ledger),
        workload=_workload(run), positions=position_table(run) if run is not None else None,
        interaction_rows=inter, interaction_table=inter_table, precisions=precisions, reference=ledger.reference,
        data_json=_json_for_script(_clean({"calculator": ledger.calculator | {
            "scenario": ledger.scenario, "reference": ledger.reference, "material": MATERIAL,
            # the ledger's answer per scenario: the page quotes its verdict while the inputs are the file's
            "answers": {a.scenario: {"recommended": a.recommended, "cost": a.cost, "confidence": a.confidence}
                        for a in (ledger.answer.scenarios if ledger.answer else [])}}})),
        calculator_js=(ASSETS / "calculator.js").read_text(encoding="utf-8"),
        page_js=(ASSETS / "page.js").read_text(encoding="utf-8"),
        facts=evidence.first_screen(ledger, run), files=evidence.run_files(rdir, odir),
        reproduce=evidence.reproduce(ledger, run), versions=evidence.versions(run),
        gates=evidence.gates(run), graded_kinds=evidence.graded_by_kind(run),
        retries=attempts_rows(ledger),
    )
    source = run.workload.source if run is not None and run.workload is not None else None
    return scrub(html, [rdir.parent, Path(__file__).parents[1], Path.cwd(), Path.home(), evidence.DEFAULT_COSTS.parent,
                        *([Path(source).parent] if source else [])])


def write_report(run_dir: str | Path, ledger_result: LedgerResult, out_path: str | Path) -> Path:
    """Write the report as one HTML file, replacing any earlier one whole (records/durable.py)."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    html = render_report(ledger_result, run_dir, out.parent)
    return durable.write_text(out, html)

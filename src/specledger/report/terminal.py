"""The cost table for the terminal: one row per configuration, verdict last."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from specledger.ledger.answer import money as money  # the answer's amounts and the tables' alike
from specledger.ledger.concurrency import ConcurrencyBreakEven
from specledger.ledger.price import ConfigCost, LedgerResult
from specledger.ledger.saving_sources import SavingSource
from specledger.report.attempts import attempts_table
from specledger.report.interaction import interaction_grid, interaction_rows

VERDICT_STYLE = {"cheapest": "bold green", "dominated": "dim", "trade-off": "yellow", "infeasible": "red",
                 "not comparable": "magenta", "infinite cost": "red", "indistinguishable": "cyan"}


def num(v: float | None, fmt: str, suffix: str = "") -> str:
    """A figure, or "–" where there is none (the terminal table and the HTML report alike)."""
    return "–" if v is None else format(v, fmt) + suffix


def failed_cell(r: ConfigCost) -> str:
    """"0/12", or "2/12 (dropped 2)": failed requests of the priced level, each a failed attempt."""
    if not r.requests:
        return "–"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.errors.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{r.failed}/{r.requests}" + (f" ({kinds})" if kinds else "")


def _table(title: str, *columns: str, **options) -> Table:
    """A table with its title on the left and unwrapped columns; a column named ">..." is right-aligned."""
    t = Table(title=title, title_justify="left", header_style="bold", **options)
    for c in columns:
        t.add_column(c.removeprefix(">"), justify="right" if c.startswith(">") else "left", no_wrap=True)
    return t


def _speed(r: ConfigCost) -> str:
    tok = num(r.tok_s, ".1f")
    return tok if r.speedup is None else f"{tok}\n[dim]{r.speedup:.2f}×[/dim]"


def _span(p5: float | None, p95: float | None) -> str:
    """A cost's 90% interval on the line under it ("" without one)."""
    return "" if p5 is None or p95 is None else f"\n[dim]{money(p5, 2)}–{money(p95, 2).lstrip('$')}[/dim]"


def _pass(r: ConfigCost) -> str:
    """Pass rate, its 95% half-width, and failed requests (each a failed attempt) when there were any."""
    failed = f"[red]{r.failed}/{r.requests} failed[/red]" if r.failed else ""
    if r.pass_rate is None or r.pass_low is None or r.pass_high is None:
        return ("–" if r.pass_rate is None else f"{r.pass_rate:.0%}") + (f"\n{failed}" if failed else "")
    half = f"±{100 * max(r.pass_rate - r.pass_low, r.pass_high - r.pass_rate):.0f}"
    return f"{r.pass_rate:.0%}\n" + (failed if failed else f"[dim]{half}[/dim]")


def render_cost_table(ledger: LedgerResult, scenario: str | None = None) -> Table:
    """The priced configurations in 80 columns: whole names, two lines per row (the HTML report has the rest:
    TTFT, τ, $/1M tokens, P(cheapest))."""
    label = f" — {ledger.scenario}" if ledger.scenario else ""
    t = _table(f"Cost per accepted task{label}", "configuration", ">tok/s\n[dim]×ar[/dim]", ">pass",
               ">$/task\n[dim]90%[/dim]", "verdict\n[dim]engine/tools/\nlabour/maint[/dim]",
               caption=f"run {ledger.run_dir or 'measurements'}; inputs {ledger.inputs_source}", caption_justify="left")
    for r in ledger.configs:
        s = r.cost_shares  # the engine's compute (its energy included) apart from tool calls
        share = (f"{s['engine'] + s['energy']:.0%}/{s['tools']:.0%}/{s['labour']:.0%}/{s['maintenance']:.0%}"
                 if s else "–")
        verdict = f"[{VERDICT_STYLE[r.verdict]}]{r.verdict}[/]" if r.verdict in VERDICT_STYLE else r.verdict
        t.add_row(
            f"{r.name}\n[dim]{r.precision} @{r.load}[/dim]",
            _speed(r),
            _pass(r),
            ("∞" if r.infinite else money(r.total)) + _span(r.p5, r.p95),
            f"{verdict}\n[dim]{share}[/dim]",
        )
    return t


def render_notes(ledger: LedgerResult) -> Text:
    """What the table's verdict column cannot hold: each verdict's reason, and the paired quality tests."""
    out = Text()
    for r in ledger.configs:
        if r.failed:
            out.append(f"{r.name}", style="bold").append(f": failed requests {failed_cell(r)}, each priced as a "
                                                         "failed attempt\n")
    for r in ledger.configs:
        if r.verdict_detail:
            out.append(f"{r.name}", style="bold").append(f": {r.verdict}: {r.verdict_detail}\n")
    for r in ledger.configs:
        if r.speedup_low is not None:
            out.append(f"{r.name}", style="bold").append(
                f": {r.speedup:.2f}× {r.speedup_base} ({r.speedup_low:.2f}–{r.speedup_high:.2f}, 95%, paired "
                "by prompt)\n")
    for q in ledger.quality:
        out.append(f"quality {q['config_b']} vs {q['config_a']}: ", style="bold").append(f"{q['note']}\n")
    return out


def render_scenario(ledger: LedgerResult, name: str) -> Table:
    """Another scenario of the cost file, summarised (its full table: price the run with that scenario alone)."""
    t = _table(f"Cost per accepted task — {name}", "configuration", ">$/task\n[dim]90%[/dim]", ">engine\nshare",
               "verdict")
    for r in ledger.scenarios[name]:
        verdict = r["verdict"]
        t.add_row(r["name"], (money(r["total"]) if r["total"] is not None else "–") + _span(r["p5"], r["p95"]),
                  num(None if r.get("engine_share") is None else r["engine_share"] + r.get("energy_share", 0.0),
                       ".0%"),
                  f"[{VERDICT_STYLE[verdict]}]{verdict}[/]" if verdict in VERDICT_STYLE else verdict)
    return t


_SHORT = {"pass_rate": "pass rate", "hardware.price_per_device_hour": "price/device-h",
          "hardware.purchase_price": "purchase price", "acceptance.wage_per_hour": "wage/h",
          "acceptance.fix_minutes": "fix minutes", "acceptance.review_minutes": "review minutes"}


def render_break_even(ledger: LedgerResult) -> Table | None:
    """Crossings only; the sentence for each is in the HTML report."""
    crossing = [b for b in ledger.break_even if b.value is not None]
    if not crossing:
        return None
    t = _table("Break-even (where two configurations cost the same)", "configuration", "input", ">now", ">break-even",
               "cheaper")
    for b in crossing:
        side = "below" if f"{b.config_a} is cheaper below" in b.note else "above"
        t.add_row(f"{b.config_a}\n[dim]vs {b.config_b}[/dim]", _SHORT.get(b.field, b.field), num(b.current, ".4g"),
                  f"{b.value:.4g}", side)
    return t


def render_sensitivity(ledger: LedgerResult, config: str | None = None, top: int = 6) -> Table | None:
    priced = [(r.total, r.name) for r in ledger.configs if r.total is not None and r.verdict in VERDICT_STYLE]
    name = config or next((r.name for r in ledger.configs if r.verdict == "cheapest"), None) or \
        (min(priced, key=lambda p: p[0])[1] if priced else None)
    swings = ledger.sensitivity.get(name or "", [])
    if not swings:
        return None
    t = _table(f"What moves the cost of {name} most", "input\n[dim]low → high (basis)[/dim]", ">cost at low → high",
               ">swing")
    for s in swings[:top]:
        t.add_row(f"{s['label']}\n[dim]{s['low']:.4g} → {s['high']:.4g} ({s['basis']})[/dim]",
                  f"{money(s['cost_low'])} → {money(s['cost_high'])}", money(s["swing"]))
    return t


def render_interaction(ledger: LedgerResult) -> Table | None:
    """Speed-up of each method over autoregressive on the same target precision, one column per precision:
    every cell is a measured configuration (a combination is never multiplied from two runs)."""
    rows = interaction_rows(ledger)
    if not any(r["strategy"] != "ar" for r in rows):
        return None
    precisions, grid = interaction_grid(rows)
    caption = f"every cell is a measured configuration; ar row: vs {ledger.reference}"
    if any(not r["comparable"] for r in rows):
        caption += "; * not comparable (a quality gate failed)"
    t = Table(title="Speed-up over autoregressive on the same precision", title_justify="left", header_style="bold",
              caption=caption, caption_justify="left", min_width=72)
    t.add_column("method")
    for p in precisions:
        t.add_column(p, justify="right")
    for m, cells in grid:
        t.add_row(m, *(" ".join(("–" if (m == "ar" and h["vs_reference"] is None) else
                                 f"{h['vs_reference'] if m == 'ar' else h['speedup']:.2f}×")
                                + ("" if h["comparable"] else "*") for h in hits) or "[dim]not measured[/dim]"
                       for hits in cells))
    return t


def break_even_cell(b: ConcurrencyBreakEven) -> str:
    """Where a method's speed-up crosses 1, only where the sweep shows it: "≈2.1 (1.4–2.8)" (stops paying),
    "≈2.1 (pays above)" (starts paying), "none in 1–4 (faster)" / "(slower)": no crossing in the sweep."""
    c = [p.concurrency for p in b.points if p.speedup is not None]
    if b.status in ("pays throughout", "never pays"):
        return f"none in {c[0]}–{c[-1]}\n[dim]{'faster' if b.status == 'pays throughout' else 'slower'}[/dim]"
    if b.value is None:
        return "–"
    if b.status == "starts paying":
        return f"≈{b.value:.2g}\n[dim]pays above[/dim]"
    lo = f"≤{c[0]}" if b.low is None else f"{b.low:.2g}"
    hi = f"≥{c[-1]}" if b.high is None else f"{b.high:.2g}"
    return f"≈{b.value:.2g}\n[dim]{lo}–{hi}[/dim]"


SweepRow = tuple[ConfigCost, list[ConfigCost | None], ConcurrencyBreakEven | None]


def concurrency_sweep(ledger: LedgerResult) -> tuple[list[int], list[SweepRow]]:
    """The concurrencies measured and each configuration measured at two or more of them (else nothing to show):
    its first level, its level at each concurrency (None: no throughput there) and its break-even."""
    levels = sorted({r.concurrency for r in ledger.levels if r.concurrency is not None})
    swept = [n for n in dict.fromkeys(r.name for r in ledger.levels)
             if sum(1 for r in ledger.levels if r.name == n and r.concurrency is not None and r.tok_s) >= 2]
    if len(levels) < 2 or not swept:
        return [], []
    at = {(r.name, r.concurrency): r for r in ledger.levels if r.tok_s is not None}
    be = {b.config: b for b in ledger.concurrency}
    return levels, [(next(r for r in ledger.levels if r.name == n), [at.get((n, c)) for c in levels], be.get(n))
                    for n in swept]


def render_concurrency(ledger: LedgerResult) -> Table | None:
    """Throughput and speed-up at each measured concurrency, and where each method stops paying (80 columns;
    the HTML report has the chart)."""
    levels, swept = concurrency_sweep(ledger)
    if not swept:
        return None
    t = _table("Throughput and speed-up vs concurrency", "configuration", *(f">c={c}" for c in levels),
               ">break-even\n[dim]concurrency[/dim]", caption="tok/s, then speed-up over ar on the same precision at "
               "the same concurrency (95%, paired by prompt); break-even: where the speed-up crosses 1",
               caption_justify="left")
    for first, at, b in swept:
        cells = ["–" if r is None else f"{r.tok_s:.1f}" + ("" if r.speedup is None or r.strategy == "ar" else (
                 f"\n[dim]{r.speedup:.2f}×" + ("" if r.speedup_low is None else
                                                f" {r.speedup_low:.2f}–{r.speedup_high:.2f}") + "[/dim]"))
                 for r in at]
        t.add_row(f"{first.name}\n[dim]{first.precision}[/dim]", *cells,
                  "[dim]baseline[/dim]" if first.strategy == "ar" else (break_even_cell(b) if b else "–"))
    return t


def _pct(v: float) -> str:
    """A share: whole percent from 1%, two significant digits below (0.011%), 0% only for nothing."""
    return f"{v:.0%}" if v >= 0.01 or v == 0 else f"{float(f'{100 * v:.2g}'):g}%"


def saving_sources_text(parts: list[SavingSource]) -> str:
    """"speed $283 a month (95%: $249–$317) · energy none · ...": each source's monthly part, "no evidence" where its
    interval holds 0."""
    def one(p: SavingSource) -> str:
        span = "" if p.low is None or p.high is None or p.low == p.high else f" (95%: {money(p.low)} to {money(p.high)})"
        if not p.per_task and not p.evidence:
            return f"{p.source} none"
        return f"{p.source} {money(p.per_month)} a month{span}" + ("" if p.evidence else ", no evidence")
    return " · ".join(one(p) for p in parts)


def render_answer(ledger: LedgerResult) -> Text | None:
    """The answer first: per scenario what to run, what an accepted task costs, what it saves, how sure, why
    configurations tie and from which input value the choice matters (ledger/answer.py computes it)."""
    if ledger.answer is None or not ledger.answer.scenarios:
        return None
    out = Text()
    out.append("The answer\n", style="bold underline")
    for a in ledger.answer.scenarios:
        out.append(a.headline + "\n", style="bold")
        if a.confidence:
            out.append("  how sure: ", style="dim").append(a.confidence + "\n")
        if a.tie_reason:
            out.append("  why: ", style="dim").append(a.tie_reason + "\n")
        if a.sources:
            out.append("  the saving by source: ", style="dim").append(saving_sources_text(a.sources) + "\n")
        if a.quality:
            out.append("  quality: ", style="dim").append(f"{a.recommended} against {a.baseline}: {a.quality}\n")
        if a.shares:
            split = " · ".join(f"{k} {_pct(v)}" for k, v in a.shares.items())
            out.append("  cost split: ", style="dim").append(f"{split} ({a.recommended})\n")
        for t in a.thresholds:
            if t.value is not None and t.dollars_move and t.change.split(" (now ")[0] not in a.tie_reason:  # once
                out.append("  • ", style="dim").append(t.change + "\n")
        flat = [t.label for t in a.thresholds if t.value is None]
        if flat:
            out.append("  no change anywhere searched with: ", style="dim").append(", ".join(flat) + "\n")
        margin = [t.label for t in a.thresholds if t.value is not None and not t.dollars_move]
        if margin:  # each one's sentence is in ledger.json and the report
            out.append("  no gap moves in dollars with: ", style="dim").append(
                ", ".join(margin) + " (each adds the same to every configuration: only the gaps' share of the cost "
                "crosses the 1% margin)\n")
        if a.not_searched:
            out.append("  not searched (not part of this scenario): ", style="dim").append(
                "; ".join(a.not_searched) + "\n")
        if a.human_cost is not None and a.human:
            ratios = sorted(h.ratio for h in a.human if h.ratio is not None)
            if ratios:
                lo, hi = _pct(ratios[0]), _pct(ratios[-1])
                span = lo if lo == hi else f"{lo}–{hi}"
                out.append("  against a person: ", style="dim").append(
                    f"{money(a.human_cost)} a task; the configurations cost {span} of that\n")
    return out


def print_ledger(ledger: LedgerResult, console: Console | None = None, *, answer: bool = True) -> None:
    """The answer (unless the caller printed it already), then the tables that are its evidence."""
    console = console or Console()
    first = render_answer(ledger) if answer else None
    parts: list = [] if first is None else [first]
    parts += [render_cost_table(ledger), render_notes(ledger)]
    parts += [render_scenario(ledger, name) for name in ledger.scenarios]
    for extra in (render_concurrency(ledger), render_break_even(ledger), render_sensitivity(ledger),
                  attempts_table(ledger)):
        if extra is not None:
            parts.append(extra)
    console.print(Group(*parts))

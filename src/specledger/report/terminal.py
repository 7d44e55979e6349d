"""The cost table for the terminal: one row per configuration, verdict last."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table

from specledger.ledger.price import ConfigCost, LedgerResult

VERDICT_STYLE = {"cheapest": "bold green", "dominated": "dim", "trade-off": "yellow", "infeasible": "red",
                 "not comparable": "magenta", "infinite cost": "red"}


def money(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "–"
    if v == 0:
        return "$0"
    if abs(v) >= 100:
        return f"${v:,.0f}"
    return f"${v:#.{digits}g}" if abs(v) < 1 else f"${v:.2f}"


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def failed_cell(r: ConfigCost) -> str:
    """"0/12", or "2/12 (dropped 2)": failed requests of the priced level, each a failed attempt."""
    if not r.requests:
        return "–"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.errors.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{r.failed}/{r.requests}" + (f" ({kinds})" if kinds else "")


def _interval(r: ConfigCost) -> str:
    if r.p5 is None or r.p95 is None:
        return ""
    return f"{money(r.p5)}–{money(r.p95)}"


def render_cost_table(ledger: LedgerResult) -> Table:
    """Rich table of the priced configurations (the same columns as the report's table)."""
    t = Table(title=f"Cost per accepted task — {ledger.run_dir or 'measurements'} (inputs: {ledger.inputs_source})",
              title_justify="left", header_style="bold")
    for col, just in (("configuration", "left"), ("tok/s", "right"), ("TTFT p50/p95 s", "right"), ("τ", "right"),
                      ("pass", "right"), ("failed", "right"), ("$/1M tok", "right"), ("$/task", "right"), ("mean [90%]", "right"),
                      ("P(cheapest)", "right"), ("compute/labour/maint", "right"), ("verdict", "left")):
        t.add_column(col, justify=just)
    for r in ledger.configs:
        s = r.shares
        share = f"{s['compute']:.0%}/{s['labour']:.0%}/{s['maintenance']:.0%}" if s else "–"
        verdict = r.verdict + (f" ({r.verdict_detail})" if r.verdict_detail else "")
        t.add_row(
            f"{r.name} [dim]{r.precision} @{r.load}[/dim]",
            _num(r.tok_s, ".1f"),
            f"{_num(r.ttft_p50, '.2f')}/{_num(r.ttft_p95, '.2f')}",
            _num(r.tau, ".2f"),
            f"{_num(r.pass_rate, '.0%')}",
            failed_cell(r),
            money(r.per_million_tokens),
            "∞" if r.infinite else money(r.total),
            f"{money(r.mean)} [{_interval(r)}]" if r.mean is not None or r.p5 is not None else "–",
            _num(r.p_cheapest, ".0%"),
            share,
            f"[{VERDICT_STYLE.get(r.verdict, '')}]{verdict}[/]" if r.verdict in VERDICT_STYLE else verdict,
        )
    return t


def render_break_even(ledger: LedgerResult) -> Table | None:
    crossing = [b for b in ledger.break_even if b.value is not None]
    if not crossing:
        return None
    t = Table(title="Break-even (where two configurations cost the same)", title_justify="left", header_style="bold")
    for col in ("configuration", "vs", "input", "now", "break-even", "meaning"):
        t.add_column(col)
    for b in crossing:
        t.add_row(b.config_a, b.config_b, b.field, _num(b.current, ".4g"), f"{b.value:.4g}", b.note)
    return t


def render_sensitivity(ledger: LedgerResult, config: str | None = None, top: int = 6) -> Table | None:
    name = config or next((r.name for r in ledger.configs if r.verdict == "cheapest"), None)
    swings = ledger.sensitivity.get(name or "", [])
    if not swings:
        return None
    t = Table(title=f"What moves the cost of {name} most", title_justify="left", header_style="bold")
    for col in ("input", "low → high", "cost at low", "cost at high", "swing", "basis"):
        t.add_column(col)
    for s in swings[:top]:
        t.add_row(s["label"], f"{s['low']:.4g} → {s['high']:.4g}", money(s["cost_low"]), money(s["cost_high"]),
                  money(s["swing"]), s["basis"])
    return t


def render_interaction(ledger: LedgerResult) -> Table | None:
    """Speed-up of each method over autoregressive on the same target precision, one column per precision:
    every cell is a measured configuration (a combination is never multiplied from two runs)."""
    from specledger.report.html import interaction_rows

    rows = interaction_rows(ledger)
    if not any(r["strategy"] != "ar" for r in rows):
        return None
    precisions = sorted({r["precision"] for r in rows}, key=lambda p: (p not in ("fp32", "bf16", "fp16"), p))
    methods = sorted({r["strategy"] for r in rows}, key=lambda s: (s != "ar", s))
    t = Table(title="Speed-up over autoregressive on the same precision", title_justify="left", header_style="bold",
              caption=f"every cell is a measured configuration; ar row: vs {ledger.reference}", caption_justify="left",
              min_width=72)
    t.add_column("method")
    for p in precisions:
        t.add_column(p, justify="right")
    for m in methods:
        cells = []
        for p in precisions:
            hits = [r for r in rows if r["strategy"] == m and r["precision"] == p]
            cells.append(" ".join(
                ("–" if (m == "ar" and h["vs_reference"] is None) else
                 f"{h['vs_reference'] if m == 'ar' else h['speedup']:.2f}×")
                + ("" if h["comparable"] else "*") for h in hits) or "[dim]not measured[/dim]")
        t.add_row(m, *cells)
    if any(not r["comparable"] for r in rows):
        t.caption += "; * not comparable (a quality gate failed)"
    return t


def print_ledger(ledger: LedgerResult, console: Console | None = None) -> None:
    console = console or Console()
    parts = [render_cost_table(ledger)]
    for extra in (render_break_even(ledger), render_sensitivity(ledger)):
        if extra is not None:
            parts.append(extra)
    console.print(Group(*parts))

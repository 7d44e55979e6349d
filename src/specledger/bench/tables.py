"""Terminal tables of a run (end of `bench`, `show`) and of two runs side by side (`diff`)."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from specledger.records.config import result_baselines
from specledger.records.pairing import speedup
from specledger.records.results import RunResult, error_kinds, kind_passes


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def _ms_short(x: float | None) -> str:
    """Milliseconds in at most 6 characters: a decimal only below 100 ms."""
    return "-" if x is None else f"{x * 1000:.1f}" if x < 0.1 else f"{x * 1000:.0f}"


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def conditions_line(run: RunResult) -> str:
    c = run.conditions
    # torch_threads None: no in-process configuration (HTTP servers choose their own)
    parts = [f"run {run.run_id} ({run.status})", f"python {c.python}", f"torch {c.torch}", f"specledger {c.specledger}",
             c.cpu_model or "cpu ?", c.torch_threads is not None and f"{c.torch_threads} threads", c.gpu,
             c.kernel and f"products: {c.kernel}", f"energy: {c.energy}"]
    return " | ".join(str(p) for p in parts if p)


# Below this console width the run's tables are stacked (two lines a row, fewer columns) so that every column
# keeps whole values and whole configuration names at 80 columns; the full layouts need ~180.
WIDE = 180


def run_table(run: RunResult, width: int = WIDE) -> Table:
    if width < WIDE:
        return _run_table_stacked(run)
    t = Table(title="Per configuration and load level (latencies in ms; tok/s over the measurement phase)",
              title_justify="left")
    for col in ("config", "strategy", "load", "ok/failed", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p50",
                "ITL p99", "e2e p50", "tok/s", "req/s", "goodput", "tau", "acceptance", "pass", "comparable"):
        t.add_column(col, justify="left" if col in ("config", "strategy", "load", "acceptance", "comparable")
                     else "right")
    for c in run.configs:
        for lr in c.loads:
            a = lr.aggregate
            comp = Text("yes", style="green") if c.comparable else Text("no", style="red")
            acc = " ".join(f"{x.name} {x.rate:.0%}" for x in a.acceptance if x.rate is not None) or "-"
            t.add_row(c.name, c.strategy, lr.load, f"{a.requests_ok}/{a.requests_failed}",
                      _ms(a.ttft.p50), _ms(a.ttft.p99), _ms(a.tpot.p50), _ms(a.itl.p50), _ms(a.itl.p99),
                      _ms(a.e2e.p50), _f(a.output_tok_s, "{:.1f}"), _f(a.requests_s), _f(a.goodput_rps),
                      _f(a.tau), acc, _f(c.pass_rate, "{:.0%}"), comp)
    return t


def _run_table_stacked(run: RunResult) -> Table:
    """The run table in 80 columns: each cell two values, the second dimmed (the HTML report has goodput and
    ITL p50)."""
    t = Table(title="Per configuration and load level (ms; tok/s over the measurement phase)", title_justify="left",
              header_style="bold")
    for head in ("configuration\n[dim]strategy @load ok/failed[/dim]", "TTFT\n[dim]p99[/dim]",
                 "TPOT\n[dim]ITL p99[/dim]", "e2e p50\n[dim]req/s[/dim]", "tok/s\n[dim]τ[/dim]",
                 "pass\n[dim]accepted[/dim]"):
        t.add_column(head, justify="left" if head.startswith("configuration") else "right", no_wrap=True)
    for c in run.configs:
        mark = "" if c.comparable else "\n[red]not comparable[/red]"  # a line of its own: names stay whole
        for lr in c.loads:
            a = lr.aggregate
            acc = "/".join(f"{x.rate:.0%}" for x in a.acceptance if x.rate is not None) or "-"
            t.add_row(f"{c.name}\n[dim]{c.strategy} @{lr.load} {a.requests_ok}/{a.requests_failed}[/dim]{mark}",
                      f"{_ms_short(a.ttft.p50)}\n[dim]{_ms_short(a.ttft.p99)}[/dim]",
                      f"{_ms_short(a.tpot.p50)}\n[dim]{_ms_short(a.itl.p99)}[/dim]",
                      f"{_ms_short(a.e2e.p50)}\n[dim]{_f(a.requests_s)}[/dim]",
                      f"{_f(a.output_tok_s, '{:.1f}')}\n[dim]{_f(a.tau)}[/dim]",
                      f"{_f(c.pass_rate, '{:.0%}')}\n[dim]{acc}[/dim]")
    return t


def category_table(run: RunResult, width: int = WIDE) -> Table:
    """tau and speed-up (tok/s vs the `ar` configuration of the same target) per category; narrower than WIDE,
    each configuration and load heads its block of categories instead of filling two columns of every row."""
    stacked = width < WIDE
    t = Table(title="Per category (speed-up: output tok/s vs autoregressive, same target and load)",
              title_justify="left")
    cols = ("category", "n", "tok/s", "τ", "×ar", "pass") if stacked else \
        ("config", "load", "category", "requests", "tok/s", "tau", "speed-up", "pass")
    for col in cols:
        t.add_column(col, justify="left" if col in ("config", "load", "category") else "right", no_wrap=stacked)
    pairs, by_name = result_baselines(run.configs), {c.name: c for c in run.configs}
    for c in run.configs:
        ref = by_name.get(pairs.get(c.name, ""))
        for lr in c.loads:
            ref_lr = next((x for x in ref.loads if x.load == lr.load), None) if ref else None
            if stacked and lr.by_category:
                t.add_row(f"[bold]{c.name} @{lr.load}[/bold]", *[""] * (len(cols) - 1))
            for cat, a in lr.by_category.items():
                ra = ref_lr.by_category.get(cat) if ref_lr else None
                speed = speedup(a.output_tok_s, ra.output_tok_s) if ra else None
                values = (str(a.requests_ok), _f(a.output_tok_s, "{:.1f}"), _f(a.tau), _f(speed, "{:.2f}x"),
                          f"{a.passed}/{a.graded}" if a.graded else "-")
                if stacked:
                    t.add_row(f"  {cat}", *values)
                else:
                    t.add_row(c.name, lr.load, cat, *values)
    return t


def server_speculation_table(run: RunResult) -> Table:
    """What the servers' own counters say over each load level's window: acceptance, tau per drafting step
    and acceptance per draft position; gauges (SGLang) as read at the end, marked instantaneous."""
    t = Table(title="Server speculation counters over each load level (acceptance at draft position 1, 2, ...)",
              title_justify="left")
    for col in ("config", "load", "source", "drafts", "proposed", "accepted", "rate", "tau", "per position"):
        t.add_column(col, justify="left" if col in ("config", "load", "source", "per position") else "right")
    for c in run.configs:
        for lr in c.loads:
            tele = lr.telemetry or {}
            for a in lr.telemetry_levels:
                pos = " ".join(f"{r:.0%}" for r in a.position_rates[:8]) or "-"
                t.add_row(c.name, lr.load, a.name, _f(a.drafts, "{:d}"), str(a.proposed), str(a.accepted),
                          _f(a.rate, "{:.0%}"), _f((tele.get("tau") or {}).get(a.name)), pos)
            for source, g in (tele.get("gauges") or {}).items():
                length = (g.get("spec_accept_length") or {}).get("mean")
                rate = (g.get("spec_accept_rate") or {}).get("mean")
                t.add_row(c.name, lr.load, f"{source} (instantaneous gauges)", "-", "-", "-", _f(rate, "{:.0%}"),
                          _f(length), "-")
    return t


def gates_text(run: RunResult) -> Text:
    out = Text()
    for c in run.configs:
        for g in c.gates:
            mark = {True: ("pass", "green"), False: ("FAIL", "red"), None: ("n/a", "dim")}[g.passed]
            out.append(f"{c.name} ", style="bold").append(f"{g.name} ").append(*mark).append(f": {g.reason}\n")
    for n in run.notes:
        out.append(f"note: {n}\n", style="dim")
    return out


def failures_text(run: RunResult) -> Text:
    """Per configuration and load level with any: failed requests by kind, and transport retries (requests
    re-sent because a stale or refused connection failed before any response; not failures)."""
    out = Text()
    for c in run.configs:
        for lr in c.loads:
            a = lr.aggregate
            if not a.requests_failed and not a.transport_retries:
                continue
            out.append(f"{c.name} {lr.load}: ", style="bold")
            if a.requests_failed:
                n = a.requests_ok + a.requests_failed
                kinds = error_kinds(a).replace("=", " ").replace(";", ", ")
                out.append(f"{a.requests_failed}/{n} failed ({kinds})", style="red")
            if a.transport_retries:
                out.append(("; " if a.requests_failed else "") + f"{a.transport_retries} transport retries (stale or "
                           "refused connections, sent again)")
            out.append("\n")
    return out


def steady_text(run: RunResult) -> Text:
    """Per level held for steady state: burst vs steady throughput, when it settled, energy per request there,
    and the machine's clock and heat; a warning where the level ended before it settled."""
    out = Text()
    for c in run.configs:
        for lr in c.loads:
            ss = lr.steady_state
            if ss is None:
                continue
            out.append(f"{c.name} {lr.load}: ", style="bold")
            burst = f"burst {_f(ss.burst_tok_s, '{:.1f}')} tok/s"
            if ss.reached and ss.steady_tok_s is not None and ss.burst_tok_s:
                out.append(f"{burst}, steady {ss.steady_tok_s:.1f} tok/s ({ss.steady_tok_s / ss.burst_tok_s:.2f}x the "
                           f"burst) after {_f(ss.time_to_steady_s, '{:.0f}')} s")
                if ss.steady_j_per_request is not None:
                    out.append(f", {ss.steady_j_per_request:.1f} J/request at steady state ({run.conditions.energy})")
            else:
                out.append(f"{burst}; NOT STEADY when the level ended ({len(ss.windows_tok_s)} window(s) of "
                           f"{ss.window}): its figures are a burst's", style="yellow")
            mhz = [x.cpu_mhz for x in ss.samples if x.cpu_mhz]
            temps = [x.cpu_temp_c for x in ss.samples if x.cpu_temp_c]
            if mhz:
                out.append(f"; CPU {min(mhz):.0f}-{max(mhz):.0f} MHz")
            if temps:
                out.append(f", {min(temps):.0f}-{max(temps):.0f} C")
            out.append("\n")
    return out



def workload_text(run: RunResult) -> Text:
    """What was read, chosen and skipped (per kind), and how each kind is graded."""
    out = Text()
    w = run.workload
    if w is None:
        return out
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(w.by_kind.items()))
    out.append("workload ", style="bold")
    out.append(f"{w.spec}: {w.format} ({w.chosen}); {w.questions} questions ({kinds}); selection: {w.selection}; "
               f"read {w.read} record(s){'' if w.complete else ' (stopped at the limit)'}\n")
    skipped = sum(w.skipped.values())
    out.append(f"skipped lines: {skipped}" + (" (" + ", ".join(f"{k} {n}" for k, n in sorted(w.skipped.items()))
                                              + ")" if skipped else "") + "\n",
               style="yellow" if skipped else "")
    from specledger.quality.graders import GRADING_NOTE

    if any(not g.startswith("user grader") for g in w.grading.values()):
        out.append(f"grading, {GRADING_NOTE}\n", style="dim")
    for k in sorted(w.grading):
        passes = kind_passes(run, k)
        out.append(f"graded {k}: {w.grading[k]} [{w.with_reference.get(k, 0)} of {w.by_kind.get(k, 0)} questions "
                   "have a reference]" + (f"; passed: {passes}" if passes else "") + "\n", style="dim")
    return out


def render_run(run: RunResult, *, categories: bool = True, width: int = WIDE) -> Group:
    """Everything `bench` and `show` print of a run, laid out for a console `width` columns wide."""
    parts: list[RenderableType] = [Text(conditions_line(run), style="dim"), run_table(run, width)]
    parts += [t for t in (failures_text(run), steady_text(run)) if t]  # each only where it has a line
    if categories and any(lr.by_category for c in run.configs for lr in c.loads):
        parts.append(category_table(run, width))
    if any(lr.telemetry_levels or (lr.telemetry or {}).get("gauges") for c in run.configs for lr in c.loads):
        parts.append(server_speculation_table(run))
    parts.append(gates_text(run))
    parts.append(workload_text(run))
    return Group(*parts)


def print_run(run: RunResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(render_run(run, width=console.width))


_DIFF = (
    ("TTFT p50 ms", lambda a: a.ttft.p50, 1000), ("TTFT p99 ms", lambda a: a.ttft.p99, 1000),
    ("TPOT p50 ms", lambda a: a.tpot.p50, 1000), ("ITL p99 ms", lambda a: a.itl.p99, 1000),
    ("e2e p50 ms", lambda a: a.e2e.p50, 1000), ("tok/s", lambda a: a.output_tok_s, 1),
    ("req/s", lambda a: a.requests_s, 1), ("tau", lambda a: a.tau, 1),
    ("failed", lambda a: float(a.requests_failed), 1),
)


def diff_table(a: RunResult, b: RunResult) -> Table:
    """Aggregates of configurations present in both runs (same name and load level): A, B and B/A."""
    t = Table(title=f"A = {a.run_id}   B = {b.run_id}", title_justify="left")
    for col in ("config", "load", "metric", "A", "B", "B/A"):
        t.add_column(col, justify="left" if col in ("config", "load", "metric") else "right")
    matched = [(ca.name, la, lb) for ca in a.configs if (cb := b.config(ca.name)) is not None for la in ca.loads
               if (lb := next((x for x in cb.loads if x.load == la.load), None)) is not None]
    for config, la, lb in matched:
        for i, (name, get, scale) in enumerate(_DIFF):
            va, vb = get(la.aggregate), get(lb.aggregate)
            ratio = f"{vb / va:.2f}" if va and vb is not None else "-"
            fmt = "{:.1f}" if scale != 1 or name == "tok/s" else "{:.2f}"
            t.add_row(config if i == 0 else "", la.load if i == 0 else "", name,
                      _f(None if va is None else va * scale, fmt), _f(None if vb is None else vb * scale, fmt),
                      ratio, end_section=i == len(_DIFF) - 1)
    if not matched:
        t.caption = "no configuration (name and load level) appears in both runs"
    return t

"""Static charts of the report: matplotlib figures rendered to inline SVG (text kept as text)."""

from __future__ import annotations

import io
import math
import re
from typing import Sequence

import numpy as np
from matplotlib import rcParams
from matplotlib.figure import Figure
from markupsafe import escape
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from specledger.records.results import SteadyState
from specledger.ledger.answer import CurveSeries, ScenarioAnswer
from specledger.ledger.measurements import ConfigMeasurement, measurement_baselines
from specledger.ledger.price import LedgerResult
from specledger.records.pairing import speedup
from specledger.report.interaction import first_level, interaction_axes

rcParams["svg.fonttype"] = "none"
rcParams["svg.hashsalt"] = "specledger"  # stable ids: the same data gives the same file
# One SVG unit is one CSS pixel at a chart's natural size, and the page never shows a chart smaller than that
# (it scrolls sideways inside its box instead): no chart text below 10 px, phone or desktop.
MIN_FONT_PX = 10
rcParams.update({"font.size": 11, "axes.labelsize": 11, "xtick.labelsize": MIN_FONT_PX, "ytick.labelsize": MIN_FONT_PX,
                 "legend.fontsize": MIN_FONT_PX, "axes.titlesize": 11,
                 "axes.spines.top": False, "axes.spines.right": False})
# seaborn's deep palette darkened where it was lighter than 3:1 against white (WCAG's rule for lines and marks)
PALETTE = ["#4C72B0", "#C05A17", "#3B8A4E", "#C44E52", "#8172B3", "#937860", "#B8478F", "#767676", "#8A7B14", "#1F7F99"]
REFERENCE_GREY = "#767676"  # reference lines (p95, today's value): 4.5:1 on white


def svg(fig: Figure, label: str) -> str:
    """The figure as inline SVG, one image to assistive technology: role="img" and `label` (what it shows) as its
    aria-label and <title>."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = re.sub(r"^.*?(<svg)", r"\1", text, count=1, flags=re.S)
    text = re.sub(r"<metadata>.*?</metadata>", "", text, count=1, flags=re.S)
    m = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', text)
    if m:  # natural size: one unit per pixel (rounded up: never a hair under 10 px); wider on a wide screen (up to
        # 1.3x), never narrower
        w, h = math.ceil(float(m[1])), math.ceil(float(m[2]))
        text = re.sub(r'width="[\d.]+pt" height="[\d.]+pt"',
                      f'width="{w}" height="{h}" style="width: 100%; min-width: {w}px; max-width: {1.3 * w:.0f}px"',
                      text, count=1)
    said = escape(label)
    return re.sub(r"<svg\b([^>]*)>", lambda m: f'<svg role="img" aria-label="{said}"{m[1]}><title>{said}</title>',
                  text, count=1)


def _plain() -> FuncFormatter:
    """Log-axis ticks as plain numbers (matplotlib's default writes 2^3 with a 7 px exponent)."""
    return FuncFormatter(lambda v, _: f"{v:g}")


def _figure(w: float = 7.5, h: float = 3.4) -> Figure:
    """A figure laid out by matplotlib's constrained layout (labels never drawn over each other)."""
    return Figure(figsize=(w, h), layout="constrained")


def _legend_below(fig: Figure, ax, n: int) -> None:
    """The legend under the plot, outside the axes: it hides neither the data nor the tick labels."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(n, 3), frameon=False)


def _bars_over_one(groups: list[str], series: dict[str, list[float | None]], ylabel: str, label: str,
                   h: float = 3.4) -> str:
    """Grouped bars, one series per colour, against a dashed line at 1 (no gain); `label` says what they show."""
    fig = _figure(7.5, h)
    ax = fig.add_subplot()
    n = max(len(series), 1)
    width = 0.8 / n
    x = np.arange(len(groups))
    for i, (name, vals) in enumerate(series.items()):
        ys = [np.nan if v is None else v for v in vals]
        ax.bar(x + (i - (n - 1) / 2) * width, ys, width, label=name, color=PALETTE[i % len(PALETTE)])
    ax.set_xticks(x, groups, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_ylabel(ylabel)
    _legend_below(fig, ax, n)
    ax.axhline(1.0, color="#444", lw=0.8, ls="--")
    return svg(fig, f"{label}: bars for {', '.join(series)}, over {', '.join(groups)}; dashed line at 1")


def speedup_by_kind(ledger: LedgerResult) -> str | None:
    """Speed-up over autoregressive on the same model and precision, per task kind."""
    ms = first_level(ledger.measurements)
    pairs = measurement_baselines(ms)
    base = {m.name: m for m in ms}
    kinds = sorted({k for m in ms for k in m.by_kind})

    def ratio(m: ConfigMeasurement, b: ConfigMeasurement, k: str) -> float | None:
        mk, bk = m.by_kind.get(k), b.by_kind.get(k)
        return speedup(mk.tok_s, bk.tok_s) if mk and bk else None

    series = {m.name: [ratio(m, b, k) for k in kinds] for m in ms
              if m.strategy != "ar" and (b := base.get(pairs.get(m.name, ""))) is not None and b.load == m.load}
    if not series or not kinds:
        return None
    return _bars_over_one(kinds, series, "speed-up over autoregressive\n(same precision)",
                          "Speed-up over autoregressive decoding of the same model and precision, per task kind")


def tau_by_kind(ledger: LedgerResult) -> str | None:
    ms = [m for m in first_level(ledger.measurements) if m.tau is not None]
    kinds = sorted({k for m in ms for k in m.by_kind})
    series = {m.name: [m.by_kind[k].tau if k in m.by_kind else None for k in kinds] for m in ms}
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    if not series:
        return None
    return _bars_over_one(kinds, series, "τ: tokens per target step", "Tokens per target step (τ), per task kind")


def verify_curves(ledger: LedgerResult) -> str | None:
    # The curve belongs to the target model: configurations sharing a target (and its measured curve) are one line.
    seen: dict[tuple, list[str]] = {}
    for m in ledger.measurements:
        if m.verify_curve:
            pts = tuple(sorted((p.tokens, p.ms) for p in m.verify_curve))
            names = seen.setdefault((m.model, m.precision, pts), [])
            if m.name not in names:
                names.append(m.name)
    if not seen:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for i, ((model, precision, pts), names) in enumerate(seen.items()):
        label = f"{model} {precision}" + (f" ({', '.join(names)})" if len(names) <= 3 else f" ({len(names)} configs)")
        ax.plot([n for n, _ in pts], [ms for _, ms in pts], marker="o", label=label, color=PALETTE[i % len(PALETTE)])
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_plain())
    ax.set_xlabel("tokens verified in one forward pass")
    ax.set_ylabel("forward time (ms)")
    _legend_below(fig, ax, 1)
    return svg(fig, "Forward time (ms) against tokens verified in one pass, one line per target: "
                    + "; ".join(f"{model} {precision}" for model, precision, _ in seen))


def latency_distributions(ledger: LedgerResult) -> str | None:
    ms = first_level(ledger.measurements)
    if not any(r.ttft_s is not None for m in ms for r in m.requests):
        return None
    fig = _figure(7.5, 3.6)
    for j, (attr, label) in enumerate((("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"))):
        ax = fig.add_subplot(1, 2, j + 1)
        for i, m in enumerate(ms):
            vals = np.sort([getattr(r, attr) for r in m.requests if getattr(r, attr) is not None])
            if vals.size:
                ax.step(vals, np.arange(1, vals.size + 1) / vals.size, where="post", label=f"{m.name} (n={vals.size})",
                        color=PALETTE[i % len(PALETTE)])
        ax.axhline(0.95, color=REFERENCE_GREY, lw=0.6, ls=":")
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests ≤ x" if j == 0 else "")
        ax.xaxis.set_major_locator(MaxNLocator(4))
        if j == 0:
            _legend_below(fig, ax, len(ms))
    return svg(fig, "Latency distributions: share of requests at or under each TTFT (left) and TPOT (right), one "
                    f"line per configuration ({', '.join(m.name for m in ms)}); dotted line at 95%")


def ttft_by_input_length(ledger: LedgerResult) -> str | None:
    """Median TTFT at each prompt length, one line per configuration (a long-input sweep: bench --input-tokens)."""
    ms = first_level(ledger.measurements)
    lines = []
    for m in ms:
        by_len: dict[int, list[float]] = {}
        for r in m.requests:
            if r.ttft_s is not None and r.prompt_tokens:
                by_len.setdefault(r.prompt_tokens, []).append(r.ttft_s)
        if len(by_len) >= 2:
            lengths = sorted(by_len)
            lines.append((m.name, lengths, [float(np.median(by_len[n])) for n in lengths]))
    if not lines:
        return None
    fig = _figure(7.5, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    for i, (name, x, y) in enumerate(lines):
        ax.plot(x, y, marker="o", label=name, color=PALETTE[i % len(PALETTE)])
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_plain())
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT, median (s)")
    _legend_below(fig, ax, len(lines))
    return svg(fig, "Median time to first token against the prompt's length in tokens, one line per configuration "
                    f"({', '.join(name for name, _, _ in lines)})")


def concurrency_sweep(ledger: LedgerResult) -> str | None:
    from specledger.report.terminal import concurrency_sweep as swept_levels

    levels, swept = swept_levels(ledger)
    if not swept:
        return None
    fig = _figure(7.5, 3.6)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    ticks: set[int] = set()
    for i, (first, at, b) in enumerate(swept):
        c, rows = zip(*[(c, r) for c, r in zip(levels, at) if r is not None])
        ticks.update(c)
        color = PALETTE[i % len(PALETTE)]
        ax1.plot(c, [r.tok_s for r in rows], marker="o", label=first.name, color=color)
        ups = [np.nan if r.speedup is None else r.speedup for r in rows]
        if first.strategy == "ar" or all(np.isnan(ups)):
            continue
        lo = [0.0 if r.speedup_low is None else u - r.speedup_low for r, u in zip(rows, ups)]
        hi = [0.0 if r.speedup_high is None else r.speedup_high - u for r, u in zip(rows, ups)]
        ax2.errorbar(c, ups, yerr=[lo, hi], marker="o", capsize=3, label=first.name, color=color)
        if b is not None and b.value is not None:  # where it stops paying
            ax2.plot([b.value], [1.0], marker="x", ms=8, color=color)
    ax1.set_xlabel("concurrency")
    ax1.set_ylabel("output tok/s")
    ax2.set_xlabel("concurrency")
    ax2.set_ylabel("speed-up over autoregressive\n(95% paired; x: break-even)")
    ax2.axhline(1.0, color="#444", lw=0.8, ls="--")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
        ax.minorticks_off()
    _legend_below(fig, ax1, len(swept))
    return svg(fig, f"Output tok/s (left) and speed-up over autoregressive with 95% intervals (right) at concurrency "
                    f"{', '.join(map(str, sorted(ticks)))}, one line per configuration "
                    f"({', '.join(first.name for first, _, _ in swept)}); x marks where speculation stops paying")


def tornado(ledger: LedgerResult, config: str, top: int = 8) -> str | None:
    swings = ledger.sensitivity.get(config, [])[:top]
    base = next((r.total for r in ledger.configs if r.name == config), None)
    if not swings or base is None:  # (a configuration with a sensitivity table is priced: it has a total)
        return None
    fig = _figure(7.5, 0.45 * len(swings) + 1.0)
    ax = fig.add_subplot()
    y = np.arange(len(swings))[::-1]
    for yi, s in zip(y, swings):
        lo, hi = s["cost_low"], s["cost_high"]
        ax.barh(yi, lo - base, left=base, color="#4C72B0", height=0.6)
        ax.barh(yi, hi - base, left=base, color=PALETTE[1], height=0.6)
    ax.set_yticks(y, [f"{s['label']} ({s['basis']})" for s in swings])
    ax.axvline(base, color="#222", lw=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.set_xlabel(f"cost per accepted task of {config}\n(blue: input at low, orange: at high)")
    return svg(fig, f"Sensitivity of {config}'s cost per accepted task, one bar per input from its low (blue) to its "
                    f"high (orange) value, largest swing first: {', '.join(s['label'] for s in swings)}")


def interaction(rows: list[dict]) -> str | None:
    """Speed-up of each speculative method on each target precision, from measured runs only."""
    if not rows:
        return None
    precisions, methods = interaction_axes(rows)
    series = {}
    for p in precisions:
        series[p] = [next((r["speedup"] for r in rows if r["strategy"] == s and r["precision"] == p), None) for s in methods]
    return _bars_over_one(methods, series, "speed-up over autoregressive\non the same target precision",
                          "Speed-up of each speculation method over autoregressive decoding, per target precision", 3.0)


def _same_lines(series: list[CurveSeries], log: bool) -> list[list[CurveSeries]]:
    """Series grouped where their lines would be drawn over each other (every point within 1% of the axis span):
    one line, and one legend entry, per group."""
    def y(c: float) -> float:
        return float(np.log10(c)) if log else c

    ys = [y(p.cost) for s in series for p in s.points if p.cost is not None]
    tol = 0.01 * ((max(ys) - min(ys)) or 1.0)
    groups: list[list[CurveSeries]] = []
    for s in series:
        mine = {p.x: y(p.cost) for p in s.points if p.cost is not None}
        for g in groups:
            theirs = {p.x: y(p.cost) for p in g[0].points if p.cost is not None}
            if mine.keys() == theirs.keys() and all(abs(v - theirs[x]) <= tol for x, v in mine.items()):
                g.append(s)
                break
        else:
            groups.append([s])
    return groups


def threshold_band(sa: ScenarioAnswer) -> tuple[float, float] | None:
    """The threshold's interval as the answer chart shades it, clipped to the chart's x range (None: nothing shaded,
    so nothing is promised)."""
    th = next((t for t in sa.thresholds if t.input == sa.curve_input), None)
    xs = [p.x for s in sa.curve for p in s.points if p.cost is not None]
    if th is None or th.value is None or th.low is None or th.high is None or not xs:
        return None
    lo, hi = max(th.low, min(xs)), min(th.high, max(xs))
    return (lo, hi) if hi > lo else None


def answer_curve(sa: ScenarioAnswer) -> str | None:
    """Cost per accepted task against review minutes, one line per configuration (lines that coincide drawn and
    named once), the threshold and today's value marked: sized for a phone's width (about 360 px)."""
    series = [s for s in sa.curve if sum(p.cost is not None for p in s.points) >= 2]
    if not series:
        return None
    fig = _figure(4.6, 3.4)
    ax = fig.add_subplot()
    costs = [p.cost for s in series for p in s.points if p.cost is not None]
    log = min(costs) > 0 and max(costs) / min(costs) > 10
    groups = _same_lines(series, log)
    for i, g in enumerate(groups):
        mine = any(s.config == sa.recommended for s in g)
        pts = [(p.x, p.cost) for p in g[0].points if p.cost is not None]
        ax.plot([x for x, _ in pts], [c for _, c in pts], color=PALETTE[i % len(PALETTE)],
                lw=2.6 if mine else 1.2, label=" = ".join(s.config for s in g),
                zorder=3 if mine else 2)  # the recommendation drawn over the lines it ties with
    th = next((t for t in sa.thresholds if t.input == sa.curve_input), None)
    band = threshold_band(sa)
    if band is not None:
        ax.axvspan(*band, color="#C44E52", alpha=0.12, lw=0)
    if th is not None and th.value is not None:
        ax.axvline(th.value, color="#C44E52", ls="--", lw=1.2, label=f"threshold {th.value:.3g} {th.unit}".strip())
    if th is not None and th.current is not None:
        ax.axvline(th.current, color="#444", ls=":", lw=1.2, label=f"now {th.current:.3g} {th.unit}".strip())
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:g}"))
    ax.set_xlabel("review minutes per task")
    ax.set_ylabel("$ per accepted task")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    _legend_below(fig, ax, 1 if any(len(g) > 1 for g in groups) else 2)
    marks = ("" if th is None or th.value is None else f"; dashed: the threshold at {th.value:.3g} {th.unit}"
             + ("" if band is None else ", shaded: its 95% interval")) + (
        "" if th is None or th.current is None else f"; dotted: today's {th.current:.3g} {th.unit}")
    return svg(fig, "Cost per accepted task against review minutes per task, one line per configuration ("
               + "; ".join(" = ".join(s.config for s in g) + (" (the same line)" if len(g) > 1 else "") for g in groups)
               + f"), the recommendation {sa.recommended} thickest{marks}")


# NVML's clock event reasons that slow a busy GPU down (idle, application clocks and display clocks do not)
GPU_THROTTLING = {0x4: "SW power cap", 0x8: "HW slowdown", 0x20: "SW thermal", 0x40: "HW thermal",
                  0x80: "HW power brake"}


def steady_state(levels: Sequence[tuple[str, SteadyState]]) -> str | None:
    """Throughput by window through each level held for steady state (a marker where it settled), and below it,
    on the same time axis, the clocks (MHz) and temperatures (°C) sampled meanwhile, each panel only where the
    host exposed something: a throttling machine shows as a falling line above a falling clock or a rising heat.
    `levels`: (label, records.results.SteadyState)."""
    held = [(label, ss) for label, ss in levels if ss.windows_tok_s]
    if not held:
        return None
    samples = [x for _, ss in held for x in ss.samples]
    panels = [p for p, fields in (("mhz", ("cpu_mhz", "gpu_sm_mhz")), ("c", ("cpu_temp_c", "gpu_temp_c")))
              if any(getattr(x, f) is not None for x in samples for f in fields)]
    fig = _figure(7.5, 3.4 + 1.5 * len(panels))
    axes = fig.subplots(1 + len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [2.2] + [1.0] * len(panels)})[:, 0]
    ax, below = axes[0], dict(zip(panels, axes[1:]))
    throttled = False
    for i, (label, ss) in enumerate(held):
        color = PALETTE[i % len(PALETTE)]
        ends = ss.window_ends_s or list(range(1, len(ss.windows_tok_s) + 1))
        ax.plot(ends, ss.windows_tok_s, marker="o", ms=3, color=color,
                label=f"{label}" + ("" if ss.reached else " (not steady)"))
        if ss.reached and ss.time_to_steady_s is not None and ss.steady_tok_s is not None:
            ax.plot([ss.time_to_steady_s], [ss.steady_tok_s], marker="*", ms=11, color=color)
        for panel, field, ls in (("mhz", "cpu_mhz", "-"), ("mhz", "gpu_sm_mhz", "--"),
                                 ("c", "cpu_temp_c", "-"), ("c", "gpu_temp_c", "--")):
            pts = [(x.t, getattr(x, field)) for x in ss.samples if getattr(x, field) is not None]
            if panel in below and pts:
                below[panel].plot([t for t, _ in pts], [v for _, v in pts], ls=ls, color=color, lw=1)
        slow = [x for x in ss.samples if x.gpu_throttle and x.gpu_throttle & sum(GPU_THROTTLING)
                and x.gpu_sm_mhz is not None]
        if slow and "mhz" in below:
            throttled = True
            below["mhz"].plot([x.t for x in slow], [x.gpu_sm_mhz for x in slow], ls="", marker="x", ms=4,
                              color=color)
    ax.set_ylabel("output tok/s per window\n(*: steady from here)")
    for panel, unit, key in (("mhz", "MHz", "— CPU   -- GPU SM" + ("   x GPU throttled" if throttled else "")),
                             ("c", "°C", "— CPU (hottest sensor)   -- GPU")):
        if panel in below:
            below[panel].set_ylabel(unit)
            below[panel].text(1.0, 1.0, key, transform=below[panel].transAxes, ha="right", va="bottom",
                              fontsize=MIN_FONT_PX)
    for a in axes:
        a.yaxis.set_major_locator(MaxNLocator(4))
    axes[-1].set_xlabel("seconds into the level")
    _legend_below(fig, ax, len(held))
    return svg(fig, f"Output tok/s per window through each level held for steady state ({', '.join(lb for lb, _ in held)})"
                    + ("" if not panels else ", with the clocks and temperatures sampled meanwhile below"))

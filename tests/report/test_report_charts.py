"""The answer chart (charts.answer_curve) promises only what it draws: one legend entry per visible line (lines drawn
over each other are one line, named once) and a shaded interval only where it is shaded; every chart is an image
with a label saying what it shows."""

from __future__ import annotations

import re

from specledger.ledger.answer import CurvePoint, CurveSeries, ScenarioAnswer, Threshold
from specledger.report import charts
from specledger.report.html import _curve_note

XS = [0.0, 0.25, 0.5, 1.0, 1.5]


def series(name: str, slope: float, base: float = 1.0) -> CurveSeries:
    return CurveSeries(config=name, points=[CurvePoint(x=x, cost=base + slope * x) for x in XS])


def answer(curve: list[CurveSeries], th: Threshold | None = None) -> ScenarioAnswer:
    return ScenarioAnswer(scenario="s", recommended=curve[0].config, curve=curve, thresholds=[th] if th else [])


def legend(svg: str) -> list[str]:
    """The legend's entries: the text drawn below the axes' label (matplotlib writes each as a <text> element)."""
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    return [t for t in texts if "=" in t or t.startswith(("a", "b", "c", "threshold", "now"))]


def test_lines_drawn_over_each_other_are_one_legend_entry():
    same = [series("a", 1.0), series("b", 1.0 + 1e-6), series("c", 3.0)]
    svg = charts.answer_curve(answer(same))
    assert svg is not None
    entries = legend(svg)
    assert "a = b" in entries and "c" in entries and "b" not in entries, entries
    assert 'role="img"' in svg and "a = b (the same line)" in svg  # the label says so too
    apart = charts.answer_curve(answer([series("a", 1.0), series("b", 2.0)]))
    assert apart is not None and {"a", "b"} <= set(legend(apart))


def test_a_shaded_interval_is_promised_only_where_it_is_drawn():
    band = Threshold(input="acceptance.review_minutes", label="review", unit="min", current=0.5, value=0.8, low=0.6,
                     high=1.0, side="above")
    none = band.model_copy(update={"low": None, "high": None})
    outside = band.model_copy(update={"low": 5.0, "high": 9.0})  # beyond the chart's x range: nothing shaded
    curve = [series("a", 1.0), series("b", 2.0, 0.5)]
    for th, shaded in ((band, True), (none, False), (outside, False)):
        sa = answer(curve, th)
        svg = charts.answer_curve(sa)
        assert svg is not None
        drawn = "fill-opacity: 0.12" in svg or 'opacity="0.12"' in svg or "opacity: 0.12" in svg
        assert drawn == shaded, (th.low, th.high)
        assert ("shaded" in _curve_note(sa)) == shaded and ("shaded" in svg) == shaded

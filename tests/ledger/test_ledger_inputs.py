"""Cost input files: the example, ranges, and errors that name the field and line."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from specledger.errors import BadInput
from specledger.ledger.inputs import Range, example_text, load_inputs, parse_inputs

GOOD = """\
hardware:
  price_per_device_hour: 2
acceptance:
  retries: 1
  review_minutes: {low: 1, mode: 2, high: 4}
  fix_minutes: {low: 5, high: 15}
  wage_per_hour: 50
volume:
  tasks_per_month: 1000
"""


def test_example_file_is_valid_and_has_ranges():
    inputs = parse_inputs(example_text(), "example")
    assert inputs.base.hardware.kind == "rented"
    assert ("acceptance", "wage_per_hour") in inputs.base.ranges()
    assert "#" in example_text()  # commented


def test_point_values_and_ranges():
    res = parse_inputs(GOOD).base
    x = res.central()
    assert x["acceptance"]["review_minutes"] == 2  # the mode
    assert x["acceptance"]["fix_minutes"] == 10  # no mode: the midpoint
    assert x["hardware"]["price_per_device_hour"] == 2
    assert set(res.ranges()) == {("acceptance", "review_minutes"), ("acceptance", "fix_minutes")}
    assert res.ranges()[("acceptance", "fix_minutes")] == Range(low=5, high=15)


def _err(text: str) -> str:
    with pytest.raises(BadInput) as e:
        parse_inputs(text, "cost.yaml")
    return str(e.value)


@pytest.mark.parametrize("old,new,expected", [
    ("  wage_per_hour: 50\n", "", r"cost\.yaml:3: acceptance\.wage_per_hour: missing"),
    ("price_per_device_hour: 2", "price_per_device_hour: -2", r"cost\.yaml:2: hardware\.price_per_device_hour: -2 is below 0"),
    ("{low: 5, high: 15}", "{low: 15, high: 5}", r"cost\.yaml:6: acceptance\.fix_minutes: low 15 > high 5"),
    ("{low: 1, mode: 2, high: 4}", "{low: 1, mode: 9, high: 4}", r"cost\.yaml:5: acceptance\.review_minutes: mode 9 is outside"),
    ("  retries: 1\n", "  retries: 1\n  pass_rate: 0\n", r"cost\.yaml:5: acceptance\.pass_rate: .*infinite"),
    ("  retries: 1\n", "  retries: 1\n  pass_rate: 1.5\n", r"acceptance\.pass_rate: 1\.5 is outside \[0, 1\]"),
    ("  retries: 1\n", "  retries: -1\n", r"cost\.yaml:4: acceptance\.retries"),
    ("  tasks_per_month: 1000", "  tasks_per_month: 0", r"volume\.tasks_per_month: 0 is not above 0"),
    ("  tasks_per_month: 1000", "  tasks_per_month: 1000\n  bogus: 1", r"cost\.yaml:10: volume\.bogus: unknown field"),
    ("price_per_device_hour: 2", "price_per_device_hour: two", r"hardware\.price_per_device_hour: expected a number, got str .two.$"),
    ("price_per_device_hour: 2", "purchase_price: 2", r"hardware: missing field 'price_per_device_hour' \(needed when kind is rented\)"),
])
def test_errors_name_the_field_and_line(old, new, expected):
    assert old in GOOD
    msg = _err(GOOD.replace(old, new))
    assert "\n" not in msg
    assert re.search(expected, msg), msg


def test_owned_hardware_needs_its_fields():
    text = GOOD.replace("  price_per_device_hour: 2", "  kind: owned\n  purchase_price: 1000\n  lifetime_years: 3\n"
                        "  utilisation: 0.5\n  power_watts: 300\n  energy_price_per_kwh: 0.2")
    assert "missing field 'pue'" in _err(text)
    assert "utilisation: 1.5 is above 1" in _err(text.replace("utilisation: 0.5", "utilisation: 1.5") + "")


def test_per_configuration_overrides():
    text = GOOD + "configs:\n  eagle:\n    acceptance: {wage_per_hour: 80}\n"
    inputs = parse_inputs(text)
    assert inputs.resolve("eagle").acceptance.wage_per_hour == 80
    assert inputs.resolve("eagle").acceptance.review_minutes == Range(low=1, mode=2, high=4)
    assert inputs.resolve("other").acceptance.wage_per_hour == 50
    bad = GOOD + "configs:\n  eagle:\n    acceptance: {wage_per_hour: -3}\n"
    assert "cost.yaml:12: configs.eagle.acceptance.wage_per_hour: -3 is below 0" in _err(bad)


def test_not_yaml_and_missing_file(tmp_path):
    assert "cost.yaml:2: not valid YAML" in _err("hardware:\n  x: a: b\n")
    assert "expected a mapping" in _err("- 1\n- 2\n")
    with pytest.raises(BadInput, match="not found"):
        load_inputs(tmp_path / "nope.yaml")


def test_cost_init_writes_a_commented_example(tmp_path):
    from specledger.cli import ledger as commands

    app = typer.Typer()
    commands.register(app)
    path = tmp_path / "c.yaml"
    result = CliRunner().invoke(app, ["cost", "--init", str(path)])
    assert result.exit_code == 0, result.output
    assert load_inputs(path).base.volume.tasks_per_month is not None
    again = CliRunner().invoke(app, ["cost", "--init", str(path)])
    assert isinstance(again.exception, BadInput) and "exists" in str(again.exception)


# ---- hostile files (issue 56): bounded, strict, one line ----

def _bomb(levels: int = 9) -> str:
    rows = ['  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("where", ["junk", "acceptance"])
def test_an_alias_bomb_is_refused_quickly_even_under_an_unknown_key(where):
    """"Billion laughs" (9^9 values once expanded) ran until killed at 13-16 GB: the line index followed every alias."""
    import time

    t0 = time.perf_counter()
    msg = _err(GOOD + f"{where}:\n" + _bomb())
    assert "expand to more than 200,000 values" in msg and time.perf_counter() - t0 < 5, msg


def test_aliases_within_bounds_still_read():
    text = GOOD.replace("  wage_per_hour: 50", "  wage_per_hour: &wage 50") + "human:\n  minutes: 5\n  wage_per_hour: *wage\n"
    assert parse_inputs(text).base.human.wage_per_hour == 50


def test_deep_nesting_and_size_are_bounded():
    flow = _err(GOOD + "junk: " + "[" * 50_000 + "]" * 50_000 + "\n")  # (libyaml stops flow nesting at 1,000 itself)
    assert flow.startswith("cost.yaml:10: ") and ("nested more than 32 deep" in flow or "nesting depth" in flow), flow
    assert "cost.yaml:42: nested more than 32 deep" in _err(GOOD + "junk:\n" + "".join(
        " " * i + f"k{i}:\n" for i in range(1, 200)) + " " * 200 + "v: 1\n")
    assert "characters; cost inputs are at most 1,048,576" in _err(GOOD + "# " + "x" * (1 << 20) + "\n")


@pytest.mark.parametrize("value,expected", [
    (".inf", "must be a finite number, got inf"), ("{low: 1, high: .inf}", "high: must be a finite number"),
    (".nan", "must be a finite number, got nan"), ("yes", "expected a number, got bool 'True' (YAML reads yes/no"),
    ("'3'", "expected a number, got str '3' (quoted, so YAML reads it as text)"),
    ("{low: '1', high: 2}", "low: expected a number, got str '1'"),
])
def test_numbers_are_typed_strictly_and_finite(value, expected):
    msg = _err(GOOD.replace("price_per_device_hour: 2", f"price_per_device_hour: {value}"))
    assert msg.startswith("cost.yaml:2: hardware.price_per_device_hour") and expected in msg, msg
    assert "expected a whole number, got bool" in _err(GOOD.replace("retries: 1", "retries: true"))


def test_a_binary_inputs_file_is_one_line_and_exit_2(tmp_path):
    from specledger.cli import app

    path = tmp_path / "cost.yaml"
    path.write_bytes(b"hardware:\n  kind: rented\n\x00\x01\xff\xfe binary")
    with pytest.raises(BadInput, match=r"cost\.yaml: not a text file"):
        load_inputs(path)
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"hardware:\n  kind: rented\n\x00\x00\x00")  # valid UTF-8, still not text
    with pytest.raises(BadInput, match=r"nul\.yaml: not a text file"):
        load_inputs(nul)
    result = CliRunner().invoke(app, ["cost", str(tmp_path), "--inputs", str(path)])
    assert isinstance(result.exception, BadInput) and "not a text file" in str(result.exception)


def test_sensitivity_is_linear_in_the_number_of_tools(monkeypatch):
    """Each tool's swing prices the inputs with the other tools summed into one: the tools summed over every
    evaluation grow with N, not N^2 (5,000 tools took over 120 s)."""
    from specledger.ledger import sensitivity as sens

    work = {"tools": 0}
    real = sens.task_cost

    def counting(x, op):
        work["tools"] += len(x["task"]["tools"])
        return real(x, op)

    monkeypatch.setattr(sens, "task_cost", counting)
    per_tool = {}
    for n in (50, 200):
        tools = "".join(f"    - {{name: t{i}, calls: 1, price: 0.001, latency_s: 0.1}}\n" for i in range(n))
        resolved = parse_inputs(GOOD + f"task:\n  tools:\n{tools}").base
        work["tools"] = 0
        _sensitivity_of(resolved, sens)
        per_tool[n] = work["tools"] / n
    assert per_tool[200] < 1.5 * per_tool[50], per_tool


def _sensitivity_of(resolved, sens) -> None:
    from types import SimpleNamespace

    from specledger.ledger.cost_model import Case, OperatingPoint

    op = OperatingPoint(device_seconds_per_call=1.0, output_tokens_per_call=100.0, pass_rate=0.8, requests_per_s=1.0)
    swings = sens.sensitivity(Case("c", resolved.central(), op), resolved,
                              SimpleNamespace(graded=0, passes=0, requests=[]))  # type: ignore[arg-type]
    assert any(s.label == "t0 price" for s in swings)

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
    ("price_per_device_hour: 2", "price_per_device_hour: two", r"hardware\.price_per_device_hour: Input should be a valid number"),
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

"""The page's calculator (calculator.js under node) gives the Python ledger's numbers on the same inputs."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from specledger.ledger.inputs import parse_inputs
from specledger.ledger.measurements import measurements_from_run
from specledger.ledger.price import price_measurements
from specledger.report.html import ASSETS, _clean
from tests.ledger.test_ledger_fixtures import DEFAULT_SPECS, Spec, make_run

NODE = shutil.which("node")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(NODE is None, reason="node is not installed")]

RUNNER = """
const calc = require(process.argv[2]);
let buf = "";
process.stdin.on("data", d => buf += d);
process.stdin.on("end", () => {
  const cases = JSON.parse(buf);
  const out = cases.map(c => calc.priceAll(c.data, c.base, c.load || null).map(r => ({
    name: r.name, load: r.load, total: r.total, status: r.status, detail: r.detail, feasible: r.feasible,
    misses: r.misses, infinite: r.infinite, shares: r.shares, vs_lowest: r.vs_lowest,
    parts: r.breakdown && ["cost_per_call", "attempts", "escalation", "compute", "tools", "labour", "maintenance",
      "per_million_tokens", "energy"].map(k => r.breakdown[k])
  })));
  process.stdout.write(JSON.stringify(out));
});
"""

PARTS = ["cost_per_call", "attempts", "escalation", "compute", "tools", "labour", "maintenance", "per_million_tokens",
         "energy"]
STATUSES = ("not comparable", "infinite cost", "infeasible")  # the ledger's reasons a row has no comparable cost


def run_js(cases: list[dict], tmp_path) -> list:
    script = tmp_path / "runner.js"
    script.write_text(RUNNER)
    proc = subprocess.run([NODE, str(script), str(ASSETS / "calculator.js")], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def measurements(tmp_path_factory):
    specs = DEFAULT_SPECS + [Spec("broken", "eagle", passes=0, tau=2.0),
                             Spec("odd", "lookup", comparable=False, reason="differs"),
                             Spec("ar-sweep", "ar", concurrency=(1, 2, 4))]  # the page re-chooses its level
    return measurements_from_run(make_run(tmp_path_factory.mktemp("parity"), specs, n=12))


def random_inputs(rng: np.random.Generator, i: int) -> dict:
    """Varied cost files: rented/owned, tools, retries, overrides, demand, objectives, ranges."""
    r = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
    owned = i % 3 == 1
    hw = ({"kind": "owned", "purchase_price": r(5e3, 5e4), "lifetime_years": r(2, 6), "utilisation": r(0.2, 1.0),
           "power_watts": r(100, 900), "energy_price_per_kwh": r(0.05, 0.4), "pue": r(1.0, 1.8),
           "use_measured_energy": bool(i % 2)}
          if owned else {"kind": "rented", "price_per_device_hour": {"low": 0.5, "mode": r(1, 3), "high": 6},
                         # always on at a utilisation, or billed per busy second (utilisation then ignored)
                         "billing": "per_busy_second" if i % 4 == 2 else "always_on",
                         **({"utilisation": r(0.2, 1.0)} if i % 2 else {})})
    if i % 6 == 5:  # several devices per replica, and a concurrency sweep choice that depends on the objective
        hw["device_count"] = int(rng.integers(2, 5))
    doc = {
        "hardware": hw,
        "task": {"calls_per_task": r(1, 5), "tools": [{"name": "search", "calls": r(0, 3), "price": r(0, 0.01),
                                                          "latency_s": r(0, 1)}] if i % 2 else []},
        "acceptance": {"retries": int(rng.integers(0, 4)), "review_minutes": r(0, 5), "fix_minutes": r(0, 30),
                       "wage_per_hour": {"low": 20, "mode": r(30, 80), "high": 120}},
        "maintenance": {"engineering_hours_per_month": r(0, 20), "retraining_hours": r(0, 10),
                        "retraining_device_hours": r(0, 5), "changes_per_year": r(0, 12)},
        "volume": {"tasks_per_month": r(1e3, 1e5)},
        "latency": {"ttft_p95_s": r(0.3, 1.0)} if i % 4 == 3 else {},
    }
    if i % 5 == 2:
        doc["volume"]["demand_rps"] = r(0.5, 5)
    if i % 4 == 0:
        doc["maintenance"]["engineer_wage_per_hour"] = r(50, 150)
    if i % 3 == 2:
        doc["configs"] = {"eagle-w4": {"acceptance": {"pass_rate": r(0.5, 1.0)}, "maintenance": {"retraining": False}},
                          "ar-fp32": {"hardware": {"device_count": 2}} if not owned else {"task": {"calls_per_task": 2}}}
    return doc


def compare(py_ledger, js_rows) -> None:
    """Every number the page shows equals the ledger's point value; the page's status is the ledger's reason for
    rows out of the running, and it names no verdict (cheapest, dominated...) for the others."""
    py = {r.name: r for r in py_ledger.configs}
    assert [r["name"] for r in js_rows] == list(py)
    priced = [r.total for r in py_ledger.configs if r.verdict not in STATUSES and r.total is not None]
    for js in js_rows:
        p = py[js["name"]]
        assert js["load"] == p.load, js["name"]
        assert js["status"] == (p.verdict if p.verdict in STATUSES else ""), js["name"]
        assert js["detail"] == (p.verdict_detail if p.verdict in STATUSES else "")
        assert js["infinite"] == p.infinite and js["feasible"] == p.feasible
        if js["status"] == "" and p.total is not None:
            assert js["vs_lowest"] == pytest.approx(p.total / min(priced) - 1, rel=1e-9, abs=1e-12)
        else:
            assert js["vs_lowest"] is None
        shares = p.cost_shares
        assert (js["shares"] is None) == (not shares), js["name"]
        for k, v in shares.items():
            assert js["shares"][k] == pytest.approx(v, rel=1e-9, abs=1e-15), (js["name"], k)
        if p.total is None:
            assert js["total"] is None
        else:
            assert js["total"] == pytest.approx(p.total, rel=1e-12)
        for name, v in zip(PARTS, js["parts"]):
            want = getattr(p, name)
            if want is None or (isinstance(want, float) and math.isnan(want)):
                continue
            assert v == pytest.approx(want, rel=1e-12, abs=1e-15), (js["name"], name)


def test_js_and_python_agree_on_varied_inputs(measurements, tmp_path):
    rng = np.random.default_rng(7)
    ledgers, cases = [], []
    for i in range(12):
        inputs = parse_inputs(yaml.safe_dump(random_inputs(rng, i)), f"variant-{i}")
        ledger = price_measurements(measurements, inputs, samples=0)
        data = _clean(ledger.calculator)
        ledgers.append(ledger)
        cases.append({"data": data, "base": data["base"]})
    results = run_js(cases, tmp_path)
    for ledger, rows in zip(ledgers, results):
        compare(ledger, rows)


def test_editing_an_input_in_the_page_matches_repricing_in_python(measurements, tmp_path):
    """The calculator starts from one file's data and edits its base; Python re-prices the edited file."""
    rng = np.random.default_rng(11)
    doc = random_inputs(rng, 2)
    start = price_measurements(measurements, parse_inputs(yaml.safe_dump(doc)), samples=0)
    data = _clean(start.calculator)
    cases, ledgers = [], []
    for path, value in ((("acceptance", "wage_per_hour"), 95.0), (("acceptance", "retries"), 0),
                        (("hardware", "price_per_device_hour"), 40.0), (("volume", "tasks_per_month"), 10.0)):
        edited = json.loads(json.dumps(data["base"]))
        edited[path[0]][path[1]] = value
        doc2 = json.loads(json.dumps(doc))
        doc2[path[0]][path[1]] = value
        ledgers.append(price_measurements(measurements, parse_inputs(yaml.safe_dump(doc2)), samples=0))
        cases.append({"data": data, "base": edited})
    for ledger, rows in zip(ledgers, run_js(cases, tmp_path)):
        compare(ledger, rows)


def test_js_formulas_hand_cases(tmp_path):
    script = tmp_path / "f.js"
    script.write_text("""
const c = require(process.argv[2]);
console.log(JSON.stringify([c.expectedAttempts(0.5, 2), c.expectedAttempts(0, 3), c.expectedAttempts(1, 3),
  c.expectedAttempts(1e-15, 2), c.escalationProbability(0.5, 2), c.escalationProbability(1, 0)]));
""")
    proc = subprocess.run([NODE, str(script), str(ASSETS / "calculator.js")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == pytest.approx([1.75, 4, 1, 3, 0.125, 0])

"""The ledger at the real operating point, checked against costs worked out by hand (not against Python's own
output): utilisation for rented hardware, idle time counted once with a demand rate, energy on busy seconds,
and the page's calculator (calculator.js under node) on the same hand-made cases, device count and load
level choice included."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from specledger.ledger.cost_model import SECONDS_PER_YEAR, OperatingPoint, compute_cost_per_call
from specledger.report.html import ASSETS

NODE = shutil.which("node")

# one device serves 0.5 calls/s, each call busy 2 s
OP = {"device_seconds_per_call": 2.0, "output_tokens_per_call": 100.0, "pass_rate": 0.5, "requests_per_s": 0.5,
      "device_count": 1, "energy_j_per_call": None, "ttft_p95": 1.0, "tpot_p95": 0.05, "e2e_p95": 3.0,
      "e2e_p50": 2.0, "retrains": False}
RENTED = {"kind": "rented", "price_per_device_hour": 3.6}  # $0.001 per device-second
OWNED = {"kind": "owned", "purchase_price": SECONDS_PER_YEAR * 0.001, "lifetime_years": 1.0,  # capital $0.001/s
         "utilisation": 0.25, "power_watts": 1000.0, "energy_price_per_kwh": 0.36, "pue": 1.0}

# (hardware, demand_rps, cost per call by hand)
CASES = [
    # always on, half the time busy: each busy second carries one idle second: 2 s x $0.001 / 0.5
    (RENTED | {"utilisation": 0.5}, None, 0.004),
    # billed per busy second: utilisation does not apply
    (RENTED | {"utilisation": 0.5, "billing": "per_busy_second"}, None, 0.002),
    # serverless with a demand rate: still only busy seconds
    (RENTED | {"billing": "per_busy_second"}, 0.2, 0.002),
    # always on with demand 0.2/s: one device (0.2 < 0.5) provisioned, 1 / 0.2 = 5 s paid per call, once
    (RENTED | {"utilisation": 0.5}, 0.2, 0.005),
    # owned, no demand: capital 2 s x $0.001 / 0.25 = 0.008; energy 2 s x 1 kW = 2000 J = 1/1800 kWh x 0.36
    (OWNED, None, 0.008 + 0.0002),
    # owned with demand 0.2/s: capital on 5 provisioned s (idle counted once: not / 0.25 again) = 0.005;
    # energy only while busy: 2 s, not 5 s
    (OWNED, 0.2, 0.005 + 0.0002),
]


@pytest.mark.parametrize("hw,demand,want", CASES)
def test_python_cost_per_call_by_hand(hw, demand, want):
    assert compute_cost_per_call(hw, OperatingPoint(**OP), demand) == pytest.approx(want, rel=1e-12)


def _node(script: str, payload) -> object:
    proc = subprocess.run([NODE, "-e", script, str(ASSETS / "calculator.js")], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


JS_COST = """
const c = require(process.argv[1]);
let buf = ""; process.stdin.on("data", d => buf += d);
process.stdin.on("end", () => {
  const cases = JSON.parse(buf);
  process.stdout.write(JSON.stringify(cases.map(k => c.computeCostPerCall(k.hw, k.op, k.demand))));
});
"""


@pytest.mark.browser
@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_js_cost_per_call_by_hand():
    got = _node(JS_COST, [{"hw": hw, "op": OP, "demand": demand} for hw, demand, _ in CASES])
    assert got == pytest.approx([want for _, _, want in CASES], rel=1e-12)


def _inputs(**over):
    x = {"hardware": dict(RENTED), "task": {"calls_per_task": 1, "tools": []},
         "acceptance": {"retries": 0, "pass_rate": None, "review_minutes": 0, "fix_minutes": 0, "wage_per_hour": 60},
         "maintenance": {"engineering_hours_per_month": 0, "engineer_wage_per_hour": None, "retraining": None,
                         "retraining_hours": 0, "retraining_device_hours": 0, "changes_per_year": 0},
         "volume": {"tasks_per_month": 1000, "demand_rps": None},
         "latency": {"ttft_p95_s": None, "tpot_p95_s": None, "e2e_p95_s": None, "task_s": None}}
    for path, v in over.items():
        section, key = path.split(".")
        x[section][key] = v
    return x


JS_PRICE = """
const c = require(process.argv[1]);
let buf = ""; process.stdin.on("data", d => buf += d);
process.stdin.on("end", () => {
  const k = JSON.parse(buf);
  process.stdout.write(JSON.stringify(k.bases.map(b => c.priceAll(k.data, b).map(r => [r.load, r.total]))));
});
"""


@pytest.mark.browser
@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_page_honours_device_count_and_rechooses_the_load_level():
    # c=1: 2 busy s per call, p95 TTFT 1 s; c=4: 0.8 s per call (4 in flight share the device), p95 TTFT 6 s
    c1 = dict(OP)
    c4 = dict(OP, device_seconds_per_call=0.8, requests_per_s=1.25, ttft_p95=6.0)
    data = {"base": _inputs(), "overrides": {}, "configs": [{
        "name": "a", "load": "c=1", "strategy": "ar", "precision": "fp32", "comparable": True,
        "comparable_reason": "", "tok_s": 50, "tau": None, "op": c1,
        "levels": [{"load": "c=1", "concurrency": 1, "op": c1}, {"load": "c=4", "concurrency": 4, "op": c4}]}]}
    # no retries: one attempt per task (a failure escalates, at 0 fix minutes), $0.001 per device-second
    bases = [
        _inputs(),  # no objective: c=4 is cheaper: 0.8 x 0.001
        _inputs(**{"latency.ttft_p95_s": 5.0}),  # c=4 misses 5 s TTFT: back to c=1: 2 x 0.001
        _inputs(**{"latency.ttft_p95_s": 5.0, "hardware.device_count": 2}),  # two devices per replica: x2
        _inputs(**{"latency.ttft_p95_s": 10.0}),  # relaxed again: c=4 again
    ]
    got = _node(JS_PRICE, {"data": data, "bases": bases})
    assert [rows[0][0] for rows in got] == ["c=4", "c=1", "c=1", "c=4"]
    assert [rows[0][1] for rows in got] == pytest.approx([0.0008, 0.002, 0.004, 0.0008], rel=1e-12)

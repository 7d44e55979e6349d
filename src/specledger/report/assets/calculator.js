// The ledger's cost model (specledger/ledger/cost_model.py) and its input checks (ledger/inputs.py) in plain
// JavaScript, for the report's calculator. Same formulas, same messages; tests compare both to Python.
// Point estimates only, and no verdict words: the ledger's verdicts (cheapest, indistinguishable, dominated)
// are tested on paired Monte Carlo samples of the measurements, which the page does not have.
(function (root) {
  "use strict";
  var SECONDS_PER_YEAR = 365.25 * 24 * 3600;
  var J_PER_KWH = 3.6e6;

  function expectedAttempts(q, retries) {
    var n = retries + 1;
    if (q >= 1) return 1;
    if (q < 1e-9) return n - (n * (n - 1)) / 2 * q;
    return -Math.expm1(n * Math.log1p(-q)) / q;
  }

  function escalationProbability(q, retries) {
    return Math.pow(1 - Math.min(q, 1), retries + 1);
  }

  function perBusySecond(hw) {
    return hw.kind === "rented" && hw.billing === "per_busy_second";
  }

  function deviceRatePerS(hw, provisioned) {
    var base;
    if (hw.kind === "rented") {
      base = hw.price_per_device_hour / 3600;
      if (perBusySecond(hw)) return base;
    } else {
      base = hw.purchase_price / (hw.lifetime_years * SECONDS_PER_YEAR);
    }
    if (provisioned) return base;
    var u = hw.utilisation === null || hw.utilisation === undefined ? 1 : hw.utilisation;
    return base / u;
  }

  function energyCost(hw, energyJ) {
    if (hw.kind === "rented") return 0;
    return (energyJ / J_PER_KWH) * hw.energy_price_per_kwh * hw.pue;
  }

  function deviceHourCost(hw) {
    var cost = deviceRatePerS(hw, hw.kind === "rented") * 3600;
    if (hw.kind === "owned") cost += energyCost(hw, hw.power_watts * 3600);
    return cost;
  }

  function replicasNeeded(demand, rps, deviceCount) {
    return Math.ceil(demand / rps - 1e-9) * (deviceCount || 1);
  }

  function computeCostPerCall(hw, op, demand) {
    var seconds = op.device_seconds_per_call;
    var provisioned = demand !== null && demand !== undefined && !perBusySecond(hw);
    if (provisioned) {
      seconds = replicasNeeded(demand, op.requests_per_s, op.device_count) / demand;
    }
    return deviceRatePerS(hw, provisioned) * seconds + energyPerCall(hw, op);
  }

  // The energy part of a call's compute cost (owned hardware; rent includes it), drawn only while busy.
  function energyPerCall(hw, op) {
    var useMeasured = hw.use_measured_energy === undefined ? true : hw.use_measured_energy;
    var energyJ;
    if (op.energy_j_per_call !== null && op.energy_j_per_call !== undefined && useMeasured) {
      energyJ = op.energy_j_per_call;
    } else {
      energyJ = (hw.power_watts === null || hw.power_watts === undefined ? 0 : hw.power_watts) * op.device_seconds_per_call;
    }
    return energyCost(hw, energyJ);
  }

  function toolCost(task) {
    return task.tools.reduce(function (s, t) { return s + t.calls * t.price; }, 0);
  }

  function toolLatency(task) {
    return task.tools.reduce(function (s, t) { return s + t.calls * t.latency_s; }, 0);
  }

  function maintenancePerTask(x, retrains) {
    var m = x.maintenance;
    var wage = m.engineer_wage_per_hour !== null && m.engineer_wage_per_hour !== undefined
      ? m.engineer_wage_per_hour : x.acceptance.wage_per_hour;
    var monthly = m.engineering_hours_per_month * wage;
    var doesRetrain = m.retraining !== null && m.retraining !== undefined ? m.retraining : retrains;
    if (doesRetrain) {
      var perChange = m.retraining_hours * wage + m.retraining_device_hours * deviceHourCost(x.hardware);
      monthly += (perChange * m.changes_per_year) / 12;
    }
    return monthly / x.volume.tasks_per_month;
  }

  function passRate(x, op) {
    var q = x.acceptance.pass_rate;
    return q === null || q === undefined ? op.pass_rate : q;
  }

  function taskCost(x, op) {
    var acc = x.acceptance, task = x.task, hw = x.hardware;
    var q = passRate(x, op);
    var perCall = computeCostPerCall(hw, op, x.volume.demand_rps);
    var tc = toolCost(task);
    var attempt = task.calls_per_task * perCall + tc;
    var retries = acc.retries;  // an integer: validate() rejects anything else, as the ledger does
    // a measured retry loop (ledger/attempts.py) prices its own attempts and escalations instead of the formula
    var attempts = op.attempts === null || op.attempts === undefined ? expectedAttempts(q, retries) : op.attempts;
    var esc = op.escalation === null || op.escalation === undefined ? escalationProbability(q, retries) : op.escalation;
    var wagePerMin = acc.wage_per_hour / 60;
    var compute = attempts * task.calls_per_task * perCall;
    var tools = attempts * tc;
    var labour = acc.review_minutes * wagePerMin + esc * acc.fix_minutes * wagePerMin;
    var maint = maintenancePerTask(x, op.retrains);
    var infinite = q === 0;
    var total = infinite ? Infinity : compute + tools + labour + maint;
    var perM = op.output_tokens_per_call > 0 ? (perCall / op.output_tokens_per_call) * 1e6 : NaN;
    var latency = op.e2e_p50 === null || op.e2e_p50 === undefined ? null : task.calls_per_task * op.e2e_p50 + toolLatency(task);
    return {
      cost_per_call: perCall, attempt_cost: attempt, attempts: attempts, escalation: esc,
      compute: compute, tools: tools, labour: labour, maintenance: maint, total: total,
      energy: attempts * task.calls_per_task * energyPerCall(hw, op),
      per_million_tokens: perM, task_latency_s: latency, pass_rate: q, infinite: infinite
    };
  }

  function fmtG(v) {
    // three significant digits, as cost_model.py's _g3 writes them
    return Number(v.toPrecision(3)).toString();
  }

  function objectiveMisses(x, op) {
    var lat = x.latency, misses = [];
    [["ttft_p95_s", op.ttft_p95, "p95 TTFT"], ["tpot_p95_s", op.tpot_p95, "p95 TPOT"], ["e2e_p95_s", op.e2e_p95, "p95 e2e"]]
      .forEach(function (o) {
        var limit = lat[o[0]], value = o[1];
        if (limit !== null && limit !== undefined && (value === null || value === undefined || value > limit)) {
          misses.push(o[2] + " " + (value === null || value === undefined ? "not measured" : fmtG(value) + " s") + " > " + fmtG(limit) + " s");
        }
      });
    if (lat.task_s !== null && lat.task_s !== undefined && op.e2e_p50 !== null && op.e2e_p50 !== undefined) {
      var t = x.task.calls_per_task * op.e2e_p50 + toolLatency(x.task);
      if (t > lat.task_s) misses.push("task latency " + fmtG(t) + " s > " + fmtG(lat.task_s) + " s");
    }
    return misses;
  }

  function isRange(v) {
    return v !== null && typeof v === "object" && !Array.isArray(v) && "low" in v && "high" in v;
  }

  function clone(v) { return v === undefined ? undefined : JSON.parse(JSON.stringify(v)); }

  // Same semantics as ledger/inputs.py _merge: mappings merge, anything else is replaced whole.
  function merge(base, over) {
    var out = clone(base);
    Object.keys(over || {}).forEach(function (k) {
      var v = over[k];
      if (v !== null && typeof v === "object" && !Array.isArray(v) && !isRange(v) &&
          out[k] !== null && typeof out[k] === "object" && !Array.isArray(out[k])) {
        out[k] = merge(out[k], v);
      } else {
        out[k] = clone(v);
      }
    });
    return out;
  }

  // The operating point with the inputs' device count (devices per replica): the run's device-seconds are
  // per device, so n devices occupy n times as many (ledger/measurements.py operating_point).
  function withDevices(op, x) {
    var n = x.hardware.device_count;
    if (n === null || n === undefined) return op;
    var out = clone(op);
    out.device_seconds_per_call = op.device_seconds_per_call / (op.device_count || 1) * n;
    out.device_count = n;
    return out;
  }

  // Every measured load level priced; the cheapest one meeting the objectives is kept (else the one missing
  // fewest, lowest concurrency first), as ledger/price.py choose_levels does: re-chosen on every edit.
  // `load` (e.g. "c=4") prices that level instead; null when the configuration was not measured there.
  function chooseLevel(c, x, load) {
    var levels = c.levels && c.levels.length ? c.levels : [{ load: c.load, concurrency: null, op: c.op }];
    if (load) levels = levels.filter(function (lv) { return lv.load === load; });
    var best = null;
    levels.forEach(function (lv) {
      var op = withDevices(lv.op, x);
      var b = taskCost(x, op), misses = objectiveMisses(x, op);
      var cand = { load: lv.load, concurrency: lv.concurrency, op: op, b: b, misses: misses };
      if (best === null) { best = cand; return; }
      var f1 = cand.misses.length === 0, f0 = best.misses.length === 0;
      if (f1 !== f0) { if (f1) best = cand; return; }
      if (f1) {
        var t1 = cand.b.infinite ? Infinity : cand.b.total, t0 = best.b.infinite ? Infinity : best.b.total;
        if (t1 < t0) best = cand;
      } else if (cand.misses.length < best.misses.length ||
                 (cand.misses.length === best.misses.length && (cand.concurrency || 0) < (best.concurrency || 0))) {
        best = cand;
      }
    });
    return best;
  }

  // The cost split the ledger reports (price.py cost_shares): engine compute (energy apart), tools, labour,
  // maintenance, energy; null when the cost is infinite or zero.
  function costShares(b) {
    if (b.infinite || !b.total) return null;
    return { engine: (b.compute - b.energy) / b.total, tools: b.tools / b.total, labour: b.labour / b.total,
             maintenance: b.maintenance / b.total, energy: b.energy / b.total };
  }

  // Why a row has no cost to compare (the ledger's own reasons, verdicts.py _status), or "".
  function status(r) {
    if (!r.comparable) return "not comparable";
    if (r.infinite) return "infinite cost";
    if (!r.feasible) return "infeasible";
    return "";
  }

  // Price every configuration of the calculator data with `base` as the edited inputs (at `load`, or at the
  // level the ledger would choose). Point values; `vs_lowest` is the point difference from the lowest priced.
  function priceAll(data, base, load) {
    var rows = data.configs.map(function (c) {
      var x = merge(base, (data.overrides || {})[c.name] || {});
      var pick = chooseLevel(c, x, load || null);
      var row = { name: c.name, strategy: c.strategy, precision: c.precision, tok_s: c.tok_s, tau: c.tau,
        comparable: c.comparable, comparable_reason: c.comparable_reason, load: load || c.load, breakdown: null,
        total: null, shares: null, infinite: false, feasible: false, misses: [], status: "", detail: "", vs_lowest: null,
        tasks_per_month: x.volume.tasks_per_month };
      if (pick === null) {
        row.status = "not measured";
        row.detail = "no requests completed at " + load;
        return row;
      }
      var b = pick.b;
      row.load = pick.load;
      row.ttft_p95 = pick.op.ttft_p95;
      row.e2e_p95 = pick.op.e2e_p95;
      row.breakdown = b;
      row.x = x;
      row.op = pick.op;
      row.total = b.infinite ? null : b.total;
      row.shares = costShares(b);
      row.infinite = b.infinite;
      row.feasible = pick.misses.length === 0;
      row.misses = pick.misses;
      row.status = status(row);
      row.detail = row.status === "not comparable" ? c.comparable_reason : row.status === "infinite cost"
        ? "pass rate 0: no attempt is ever accepted" : row.status === "infeasible" ? row.misses.join("; ") : "";
      return row;
    });
    var priced = rows.filter(function (r) { return r.status === "" && r.total !== null; });
    var lowest = priced.reduce(function (m, r) { return m === null || r.total < m.total ? r : m; }, null);
    // relative to the lowest; a lowest of $0 has no ratio (null), except to itself
    priced.forEach(function (r) {
      r.vs_lowest = lowest.total > 0 ? r.total / lowest.total - 1 : r.total === lowest.total ? 0 : null;
    });
    return rows;
  }

  // ---- What the page shows of a priced table: its problems, its point answer, its numbers ----

  var MAX_COST = 1e12;  // dollars per accepted task: past this an input is far outside any real value
  var PARTS = ["cost_per_call", "compute", "energy", "tools", "labour", "maintenance", "total"];

  // The first priced row whose cost is not a finite number, or is absurd, said in one line, or a monthly saving
  // against `reference` that is not finite; null when all are sound. (Inputs at the ends of the floating-point
  // range, 1e308 or 1e-320, overflow or divide into infinity.)
  function problem(rows, reference) {
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i], b = r.breakdown;
      if (!b || r.status === "infinite cost" || r.status === "not measured") continue;
      var bad = PARTS.filter(function (k) { return typeof b[k] !== "number" || !isFinite(b[k]); });
      if (bad.length) {
        return "these inputs give " + r.name + " a cost that is not a finite number (" + bad.join(", ") +
          "): an input is at the end of what the arithmetic can hold (such as 1e308, or 1e-320 as a divisor)";
      }
      if (b.total > MAX_COST) {
        return "these inputs give " + r.name + " a cost of " + money(b.total) + " per accepted task, over " +
          money(MAX_COST) + ": an input is far outside any real value";
      }
    }
    var a = pointAnswer(rows, reference, 0);
    if (a && a.saving_per_month !== null && !isFinite(a.saving_per_month)) {
      return "the monthly saving is not a finite number (tasks per month " + pyG(a.tasks_per_month) + ")";
    }
    return null;
  }

  // The answer at the page's inputs, from point values alone: the lowest priced configuration, its cost, the
  // saving against `reference` (per task, and a month at the volume it is priced at), and the next cheapest with
  // its gap. The ledger's verdicts need its paired Monte Carlo samples; `within` says whether the point gap is
  // already within the `material` margin, where no amount of evidence makes the difference count.
  function pointAnswer(rows, reference, material) {
    var priced = rows.filter(function (r) { return r.status === "" && r.total !== null; })
      .sort(function (a, b) { return a.total - b.total; });
    if (!priced.length) return null;
    var best = priced[0], next = priced.length > 1 ? priced[1] : null;
    // the baseline as the ledger's answer takes it: priced (comparable, a finite cost), feasible or not
    var base = rows.filter(function (r) { return r.name === reference && r.comparable && r.total !== null; })[0] || null;
    var out = { recommended: best.name, cost: best.total, load: best.load, baseline: base ? base.name : null,
      baseline_status: base ? base.status : "",
      baseline_cost: base ? base.total : null, saving_per_task: null, saving_per_month: null,
      tasks_per_month: best.tasks_per_month, next: next ? next.name : null, gap: null, gap_rel: null, within: null };
    if (base) {
      out.saving_per_task = base.total - best.total;
      out.saving_per_month = out.saving_per_task * best.tasks_per_month;
      if (base !== best && base.x && best.x) out.sources = savingSources(base, best);
    }
    if (next) {
      out.gap = next.total - best.total;
      out.gap_rel = best.total > 0 ? out.gap / best.total : null;
      out.within = out.gap_rel !== null && out.gap_rel <= material;
    }
    return out;
  }

  // The saving (base's cost - rec's) split by source, as ledger/saving_sources.py split() does at central values:
  // rec's pass rate and measured retry loop swapped into base's priced case first (quality), then its device time
  // and energy per call (speed, and energy: the change in the engine's energy part), the remainder the rest.
  function savingSources(base, rec) {
    var xb = base.x, ob = base.op, xr = rec.x, orec = rec.op;
    var x1 = merge(xb, { acceptance: { pass_rate: xr.acceptance.pass_rate } });
    var o1 = merge(ob, { pass_rate: orec.pass_rate, attempts: orec.attempts, escalation: orec.escalation });
    var o2 = merge(o1, { device_seconds_per_call: orec.device_seconds_per_call, requests_per_s: orec.requests_per_s,
      device_count: orec.device_count, output_tokens_per_call: orec.output_tokens_per_call,
      energy_j_per_call: orec.energy_j_per_call });
    var c0 = taskCost(xb, ob), c1 = taskCost(x1, o1), c2 = taskCost(x1, o2), c3 = taskCost(xr, orec);
    var energy = c1.energy - c2.energy;
    return { quality: c0.total - c1.total, speed: c1.total - c2.total - energy, energy: energy, rest: c2.total - c3.total };
  }

  // Dollars, compactly: cents from $1, three significant figures below, thousands separated up to $1e9, and
  // powers of ten beyond either end (never a 300-digit amount). The Python report's money() writes the same.
  function money(v) {
    if (v === null || v === undefined || typeof v !== "number" || !isFinite(v)) return "–";
    if (v === 0) return "$0";
    var a = Math.abs(v), sign = v < 0 ? "-" : "";
    if (a >= 1e9 || a < 1e-4) return sign + "$" + a.toExponential(2).replace("e+", "e");
    if (a >= 100) return sign + "$" + Math.round(a).toLocaleString("en-US");
    return sign + "$" + (a < 1 ? a.toPrecision(3) : a.toFixed(2));
  }

  // A share as a whole percentage; under 0.1% (but not 0) and over 99.9% (but not 1) said as such.
  function percent(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    if (v > 0 && v < 0.001) return "<0.1%";
    if (v < 1 && v > 0.999) return ">99.9%";
    return Math.round(v * 100) + "%";
  }

  // A cost against the lowest: "lowest", "+2.3%", or a multiple once it is over ten times ("×1.2e5").
  function versus(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    if (v === 0) return "lowest";
    if (v < 9) return "+" + (100 * v).toFixed(1) + "%";
    var m = 1 + v;
    return "×" + (m >= 1e6 ? m.toExponential(2).replace("e+", "e") : m.toPrecision(3));
  }

  // ---- Input checks: ledger/inputs.py's rules and messages (pydantic's own words where it speaks) ----

  // Python's format(x, "g"): six significant digits, trailing zeros dropped, exponent below 1e-4 or from 1e6.
  function pyG(x) {
    if (x === 0) return 1 / x < 0 ? "-0" : "0";
    var parts = x.toExponential(5).split("e"), exp = Number(parts[1]);
    function strip(t) { return t.indexOf(".") < 0 ? t : t.replace(/0+$/, "").replace(/\.$/, ""); }
    if (exp < -4 || exp >= 6) {
      return strip(parts[0]) + "e" + (exp < 0 ? "-" : "+") + (Math.abs(exp) < 10 ? "0" : "") + Math.abs(exp);
    }
    return strip(x.toFixed(Math.max(0, 5 - exp)));
  }

  // Python's str() of a float: the shortest digits that read back, an exponent below 1e-4 or from 1e16, ".0" on
  // a whole number.
  function pyStr(x) {
    var parts = x.toExponential().split("e"), exp = Number(parts[1]);
    if (exp < -4 || exp >= 16) {
      return parts[0] + "e" + (exp < 0 ? "-" : "+") + (Math.abs(exp) < 10 ? "0" : "") + Math.abs(exp);
    }
    var t = String(x);
    return t.indexOf(".") < 0 ? t + ".0" : t;
  }

  function bounds(lo, hi, loOpen, what) {
    return function (v) {
      if (lo !== null && (v < lo || (loOpen && v === lo))) return pyG(v) + " is " + (loOpen ? "not above" : "below") + " " + pyG(lo) + what;
      if (hi !== null && v > hi) return pyG(v) + " is above " + pyG(hi) + what;
      return null;
    };
  }
  var NON_NEG = bounds(0, null, false, " (must not be negative)");
  var POSITIVE = bounds(0, null, true, " (must be positive)");
  var FRACTION = bounds(0, 1, true, " (a fraction in (0, 1])");
  var PUE = bounds(1, null, false, " (PUE is at least 1)");
  function passRateCheck(v) {
    if (v === 0) return "a pass rate of 0 means no attempt is ever accepted: the cost per accepted task is infinite";
    if (v < 0 || v > 1) return pyG(v) + " is outside [0, 1]";
    return null;
  }
  function intAtLeast(lo) {
    return function (v) {
      if (v !== Math.trunc(v)) return "expected a whole number, got float '" + pyStr(v) + "'";
      return v < lo ? "Input should be greater than or equal to " + lo : null;
    };
  }
  function above0(v) { return v > 0 ? null : "Input should be greater than 0"; }

  // Field order is the models' (pydantic reports the first failing field first). [name, check, nullable, int]
  var RULES = {
    hardware: [["device_count", intAtLeast(1), true, true], ["price_per_device_hour", NON_NEG, true],
      ["purchase_price", NON_NEG, true], ["lifetime_years", POSITIVE, true], ["utilisation", FRACTION, true],
      ["power_watts", NON_NEG, true], ["energy_price_per_kwh", NON_NEG, true], ["pue", PUE, true]],
    task: [["calls_per_task", POSITIVE, false]],
    acceptance: [["retries", intAtLeast(0), false, true], ["pass_rate", passRateCheck, true],
      ["review_minutes", NON_NEG, false], ["fix_minutes", NON_NEG, false], ["wage_per_hour", NON_NEG, false]],
    maintenance: [["engineering_hours_per_month", NON_NEG, false], ["engineer_wage_per_hour", NON_NEG, true],
      ["retraining_hours", NON_NEG, false], ["retraining_device_hours", NON_NEG, false],
      ["changes_per_year", NON_NEG, false]],
    volume: [["tasks_per_month", POSITIVE, false], ["demand_rps", POSITIVE, true]],
    latency: [["ttft_p95_s", above0, true], ["tpot_p95_s", above0, true], ["e2e_p95_s", above0, true],
      ["task_s", above0, true]],
    human: [["minutes", NON_NEG, false], ["wage_per_hour", NON_NEG, true]]  // optional section: checked when given
  };
  var TOOL_FIELDS = ["calls", "price", "latency_s"];
  var NEEDED = { rented: ["price_per_device_hour"],
    owned: ["purchase_price", "lifetime_years", "utilisation", "power_watts", "energy_price_per_kwh", "pue"] };

  function checkValue(v, rule) {
    if (v === null || v === undefined) {
      if (rule[2]) return null;
      if (v === undefined) return "missing";  // a field the section leaves out
      return "expected " + (rule[3] ? "a whole number" : "a number") + ", got NoneType 'None'";
    }
    if (typeof v !== "number" || !isFinite(v)) return "must be a finite number, got " + String(v).toLowerCase();
    return rule[1](v);
  }

  // The first problem with one configuration's inputs, as {path: [the field], loc: [where pydantic reports it,
  // when not the field], message: "field: msg"} (the ledger's BadInput without its "file:line: " prefix), or
  // null when the ledger would accept them.
  function validate(x) {
    var sections = ["hardware", "task", "acceptance", "maintenance", "volume", "latency", "human"];
    for (var i = 0; i < sections.length; i++) {
      var sec = sections[i], rules = RULES[sec], obj = x[sec] || {};
      if (sec === "human" && (x.human === null || x.human === undefined)) continue;
      for (var j = 0; j < rules.length; j++) {
        var v = obj[rules[j][0]], msg = checkValue(v, rules[j]);
        // pydantic places a non-number in a number-or-range field under the union's tag: [..., "value"]
        var tagged = v === null && !rules[j][3];
        if (msg) {
          return { path: [sec, rules[j][0]], loc: tagged ? [sec, rules[j][0], "value"] : null,
                   message: sec + "." + rules[j][0] + ": " + msg };
        }
        if (sec === "task" && j === 0) {
          var tools = obj.tools || [];
          for (var t = 0; t < tools.length; t++) {
            for (var k = 0; k < TOOL_FIELDS.length; k++) {
              var tv = tools[t][TOOL_FIELDS[k]], m2 = checkValue(tv, [TOOL_FIELDS[k], NON_NEG, false]);
              if (m2) return { path: ["task", "tools", t, TOOL_FIELDS[k]],
                               loc: tv === null || tv === undefined ? ["task", "tools", t, TOOL_FIELDS[k], "value"] : null, message: "task.tools." + t + "." + TOOL_FIELDS[k] + ": " + m2 };
            }
          }
        }
      }
      if (sec === "hardware") {
        var need = NEEDED[obj.kind] || [];
        for (var n = 0; n < need.length; n++) {
          if (obj[need[n]] === null || obj[need[n]] === undefined) {
            return { path: ["hardware", need[n]], loc: ["hardware"],
                     message: "hardware: missing field '" + need[n] + "' (needed when kind is " + obj.kind + ")" };
          }
        }
      }
    }
    return null;
  }

  function hasPath(d, path) {
    for (var i = 0; i < path.length; i++) {
      if (d === null || typeof d !== "object" || !(path[i] in d)) return false;
      d = d[path[i]];
    }
    return true;
  }

  // The inputs as the ledger checks a file: the base, then each configuration's overrides merged onto it
  // (named "configs.<name>." when the problem is in the override itself). Null when all are accepted.
  function validateAll(data, base) {
    var err = validate(base);
    if (err) return err;
    var names = Object.keys(data.overrides || {});
    for (var i = 0; i < names.length; i++) {
      var over = data.overrides[names[i]];
      var e = validate(merge(base, over));
      if (e) {
        if (hasPath(over, e.loc || e.path)) e.message = "configs." + names[i] + "." + e.message;
        return e;
      }
    }
    return null;
  }

  var api = {
    expectedAttempts: expectedAttempts, escalationProbability: escalationProbability,
    deviceRatePerS: deviceRatePerS, energyCost: energyCost, deviceHourCost: deviceHourCost,
    replicasNeeded: replicasNeeded, computeCostPerCall: computeCostPerCall, toolCost: toolCost,
    toolLatency: toolLatency, maintenancePerTask: maintenancePerTask, passRate: passRate,
    taskCost: taskCost, objectiveMisses: objectiveMisses, merge: merge, priceAll: priceAll,
    chooseLevel: chooseLevel, withDevices: withDevices, energyPerCall: energyPerCall, costShares: costShares,
    validate: validate, validateAll: validateAll, pyG: pyG, problem: problem, pointAnswer: pointAnswer,
    money: money, percent: percent, versus: versus, savingSources: savingSources
  };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.SpecLedgerCalc = api;
})(this);

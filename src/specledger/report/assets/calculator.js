// The ledger's cost model (specledger/ledger/cost_model.py) in plain JavaScript, for the report's
// calculator. Same formulas, same names; tests run this file under node and compare to Python.
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
    var useMeasured = hw.use_measured_energy === undefined ? true : hw.use_measured_energy;
    var energyJ;
    if (op.energy_j_per_call !== null && op.energy_j_per_call !== undefined && useMeasured) {
      energyJ = op.energy_j_per_call;
    } else {
      energyJ = (hw.power_watts === null || hw.power_watts === undefined ? 0 : hw.power_watts) * op.device_seconds_per_call;
    }
    return deviceRatePerS(hw, provisioned) * seconds + energyCost(hw, energyJ);
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
    var retries = Math.trunc(acc.retries);
    var attempts = expectedAttempts(q, retries);
    var esc = escalationProbability(q, retries);
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

  function clone(v) { return JSON.parse(JSON.stringify(v)); }

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

  function dominates(o, r) {
    function noWorse(a, b) { return a !== null && a !== undefined && b !== null && b !== undefined && a <= b; }
    return o.total <= r.total && noWorse(o.ttft_p95, r.ttft_p95) && noWorse(o.e2e_p95, r.e2e_p95);
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
  function chooseLevel(c, x) {
    var levels = c.levels && c.levels.length ? c.levels : [{ load: c.load, concurrency: null, op: c.op }];
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

  // Price every configuration of the calculator data with `base` as the edited inputs.
  function priceAll(data, base) {
    var rows = data.configs.map(function (c) {
      var x = merge(base, (data.overrides || {})[c.name] || {});
      var pick = chooseLevel(c, x);
      var b = pick.b;
      var misses = pick.misses;
      var total = b.total;
      var shares = b.infinite || !total ? null : {
        compute: (b.compute + b.tools) / total, labour: b.labour / total, maintenance: b.maintenance / total
      };
      return {
        name: c.name, load: pick.load, strategy: c.strategy, precision: c.precision, tok_s: c.tok_s, tau: c.tau,
        ttft_p95: pick.op.ttft_p95, e2e_p95: pick.op.e2e_p95, comparable: c.comparable,
        comparable_reason: c.comparable_reason, breakdown: b, total: b.infinite ? null : total, shares: shares,
        infinite: b.infinite, feasible: misses.length === 0, misses: misses, verdict: "", verdict_detail: ""
      };
    });
    var eligible = rows.filter(function (r) { return r.comparable && r.feasible && !r.infinite && r.total !== null; });
    var cheapest = null;
    eligible.forEach(function (r) { if (cheapest === null || r.total < cheapest.total) cheapest = r; });
    rows.forEach(function (r) {
      if (!r.comparable) { r.verdict = "not comparable"; r.verdict_detail = r.comparable_reason; }
      else if (r.infinite) { r.verdict = "infinite cost"; r.verdict_detail = "pass rate 0: no attempt is ever accepted"; }
      else if (!r.feasible) { r.verdict = "infeasible"; r.verdict_detail = r.misses.join("; "); }
      else if (r === cheapest) { r.verdict = "cheapest"; }
      else {
        var better = eligible.filter(function (o) { return o !== r && dominates(o, r); });
        if (better.length) { r.verdict = "dominated"; r.verdict_detail = "by " + better[0].name + ": cheaper and no slower"; }
        else {
          r.verdict = "trade-off";
          r.verdict_detail = "+" + (100 * (r.total / cheapest.total - 1)).toFixed(1) + "% vs " + cheapest.name + ", but faster";
        }
      }
    });
    return rows;
  }

  var api = {
    expectedAttempts: expectedAttempts, escalationProbability: escalationProbability,
    deviceRatePerS: deviceRatePerS, energyCost: energyCost, deviceHourCost: deviceHourCost,
    replicasNeeded: replicasNeeded, computeCostPerCall: computeCostPerCall, toolCost: toolCost,
    toolLatency: toolLatency, maintenancePerTask: maintenancePerTask, passRate: passRate,
    taskCost: taskCost, objectiveMisses: objectiveMisses, merge: merge, priceAll: priceAll,
    chooseLevel: chooseLevel, withDevices: withDevices
  };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.SpecLedgerCalc = api;
})(this);

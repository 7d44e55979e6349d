// The report's interactive calculator: cost inputs as fields (and the scenario and load level as choices);
// every edit is checked as the ledger checks a cost file (calculator.js validateAll, the same messages) and,
// when accepted, the table and chart are recomputed with the ledger's formulas. Point estimates, no verdicts.
// No network, no libraries.
(function () {
  "use strict";
  var calc = window.SpecLedgerCalc;
  var data = JSON.parse(document.getElementById("ledger-data").textContent).calculator;
  var scenarios = data.scenarios || null;  // name -> that scenario's inputs (central values)
  var scenario = data.scenario || null;
  var start = JSON.stringify(data.base);
  var base = JSON.parse(start);
  var load = null;  // null: each configuration at the level the ledger would choose
  var SVGNS = "http://www.w3.org/2000/svg";
  // colours at least 3:1 against white (charts.py's PALETTE)
  var PARTS = [["engine", "#4C72B0"], ["tools", "#1F7F99"], ["labour", "#C05A17"], ["maintenance", "#3B8A4E"],
    ["energy", "#8A7B14"]];

  // Every input is editable: numbers (null = not set: leave the field empty), and the choices below.
  var CHOICES = {
    "hardware.kind": ["rented", "owned"],
    "hardware.billing": ["always_on", "per_busy_second"],
    "hardware.use_measured_energy": [true, false],
    "maintenance.retraining": [null, true, false]
  };

  function numericLeaves(obj, prefix, out) {
    Object.keys(obj).forEach(function (k) {
      var v = obj[k], p = prefix.concat([Array.isArray(obj) ? Number(k) : k]);
      if (CHOICES[p.join(".")]) out.push(p);
      else if (v === null && prefix.length === 0) return;  // an optional section the file leaves out (human)
      else if (v !== null && typeof v === "object") numericLeaves(v, p, out);
      else if (typeof v === "number" || v === null) out.push(p);
    });
    return out;
  }

  function choiceInput(path, id) {
    var options = CHOICES[path.join(".")];
    var select = document.createElement("select");
    select.id = id;
    options.forEach(function (o, i) {
      var opt = document.createElement("option");
      opt.value = String(i);
      opt.textContent = o === null ? "default" : String(o);
      select.appendChild(opt);
    });
    select.dataset.path = JSON.stringify(path);
    select.dataset.choice = "1";
    select.value = String(Math.max(0, options.indexOf(getPath(base, path) === undefined ? null : getPath(base, path))));
    select.addEventListener("change", function () {
      setPath(base, path, options[Number(select.value)]);
      render();
    });
    return select;
  }

  function getPath(obj, path) { return path.reduce(function (o, k) { return o[k]; }, obj); }
  function setPath(obj, path, v) { getPath(obj, path.slice(0, -1))[path[path.length - 1]] = v; }

  var money = calc.money, pct = calc.percent;

  function label(path) {
    if (path[0] === "task" && path[1] === "tools") return base.task.tools[path[2]].name + " " + path[3];
    return path.slice(1).join(".");
  }

  function buildForm() {
    var form = document.getElementById("calc-form");
    var sections = {};
    numericLeaves(base, [], []).forEach(function (path) {
      var sec = path[0];
      if (!sections[sec]) {
        var fs = document.createElement("fieldset");
        var lg = document.createElement("legend");
        lg.textContent = sec;
        fs.appendChild(lg);
        form.appendChild(fs);
        sections[sec] = fs;
      }
      var id = "in-" + path.join(".");
      var row = document.createElement("label");
      row.setAttribute("for", id);
      var span = document.createElement("span");
      span.textContent = label(path);
      if (CHOICES[path.join(".")]) {
        row.appendChild(span);
        row.appendChild(choiceInput(path, id));
        sections[sec].appendChild(row);
        return;
      }
      var input = document.createElement("input");
      input.type = "number";
      input.step = "any";
      input.id = id;
      var initial = getPath(base, path);
      input.value = initial === null || initial === undefined ? "" : String(initial);
      input.placeholder = "not set";
      input.dataset.path = JSON.stringify(path);
      input.addEventListener("input", function () {
        // cleared: not set (null); the checks below say whether the ledger allows that for this field
        var v = input.value.trim() === "" && !input.validity.badInput ? null : Number(input.value);
        setPath(base, path, input.validity.badInput ? NaN : v);
        render();
      });
      row.appendChild(span);
      row.appendChild(input);
      sections[sec].appendChild(row);
    });
    document.getElementById("calc-reset").addEventListener("click", function () {
      base = JSON.parse(start);
      fill();
      render();
    });
    choosers();
  }

  // Every field shows the value of `base` (after a reset or a change of scenario).
  function fill() {
    document.querySelectorAll("#calc-form input, #calc-form select[data-path]").forEach(function (input) {
      var path = JSON.parse(input.dataset.path), v = getPath(base, path);
      if (input.dataset.choice) input.value = String(Math.max(0, CHOICES[path.join(".")].indexOf(v === undefined ? null : v)));
      else input.value = v === null || v === undefined ? "" : String(v);
    });
  }

  // The scenario (each one's inputs as the cost file gives them) and the load level, as choices.
  function choosers() {
    var holder = document.getElementById("calc-choices");
    function select(id, text, options, onchange) {
      var row = document.createElement("label"), span = document.createElement("span"), sel = document.createElement("select");
      row.setAttribute("for", id);
      span.textContent = text;
      sel.id = id;
      options.forEach(function (o) {
        var opt = document.createElement("option");
        opt.value = o[0];
        opt.textContent = o[1];
        sel.appendChild(opt);
      });
      sel.addEventListener("change", function () { onchange(sel.value); });
      row.appendChild(span);
      row.appendChild(sel);
      holder.appendChild(row);
      return sel;
    }
    if (scenarios && Object.keys(scenarios).length > 1) {
      var sel = select("calc-scenario", "scenario", Object.keys(scenarios).map(function (n) { return [n, n]; }), function (name) {
        scenario = name;
        start = JSON.stringify(scenarios[name]);
        base = JSON.parse(start);
        fill();
        render();
      });
      if (scenario) sel.value = scenario;
    }
    var loads = [];
    data.configs.forEach(function (c) {
      (c.levels || []).forEach(function (lv) { if (loads.indexOf(lv.load) < 0) loads.push(lv.load); });
    });
    loads.sort(function (a, b) { return (Number(a.replace(/\D+/g, "")) || 0) - (Number(b.replace(/\D+/g, "")) || 0); });
    var options = [["", "the ledger's choice (cheapest meeting the objectives)"]].concat(
      loads.map(function (l) { return [l, l.indexOf("c=") === 0 ? "concurrency " + l.slice(2) : l]; }));
    select("calc-load", "load level", options, function (v) { load = v || null; render(); });
  }

  function cell(tr, text, cls, value) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    if (value !== undefined) td.dataset.value = value === null || !isFinite(value) ? "inf" : String(value);
    tr.appendChild(td);
    return td;
  }

  function sharesText(sh) {
    return sh ? PARTS.map(function (p) { return Math.round(100 * sh[p[0]]); }).join(" · ") : "–";  // header: %
  }

  function renderTable(rows) {
    var body = document.querySelector("#calc-table tbody");
    body.textContent = "";
    rows.forEach(function (r) {
      var b = r.breakdown, tr = document.createElement("tr");
      tr.dataset.config = r.name;
      tr.className = r.status ? "status-" + r.status.replace(/ /g, "-") : "";
      cell(tr, r.name + " @" + r.load);
      if (!b) {
        var td = cell(tr, r.status + " (" + r.detail + ")", "calc-status");
        td.colSpan = 9;
        body.appendChild(tr);
        return;
      }
      cell(tr, pct(b.pass_rate), "num");
      cell(tr, b.attempts.toFixed(3), "num");
      cell(tr, pct(b.escalation), "num");
      cell(tr, money(b.cost_per_call), "num calc-per-call", b.cost_per_call);
      cell(tr, money(b.per_million_tokens), "num");
      cell(tr, money(r.total), "num calc-total", r.total);
      cell(tr, calc.versus(r.vs_lowest), "num calc-vs");
      cell(tr, sharesText(r.shares), "num shares calc-shares");
      cell(tr, r.status ? r.status + " (" + r.detail + ")" : "priced", "calc-status");
      body.appendChild(tr);
    });
  }

  function el(name, attrs, text) {
    var e = document.createElementNS(SVGNS, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function renderChart(rows) {
    var holder = document.getElementById("calc-chart");
    holder.textContent = "";
    var priced = rows.filter(function (r) { return r.total !== null; });
    var barH = 22, gap = 8, left = 130, width = 600, top = 44;
    var height = top + rows.length * (barH + gap) + 30;
    var svg = el("svg", { width: width, height: height, style: "width: 100%; min-width: " + width + "px; max-width: " + width + "px", viewBox: "0 0 " + width + " " + height, role: "img",
      "aria-label": "Cost per accepted task at the inputs above, one stacked bar per configuration split into " +
        "engine, tools, labour, maintenance and energy: " + priced.map(function (r) { return r.name + " " + money(r.total); }).join(", ") });
    var max = priced.reduce(function (m, r) { return Math.max(m, r.total); }, 0) || 1;
    var span = width - left - 80;  // a part's width is its share of the largest total times this (never 1/max:
    // a largest total of 1e-320 would make that infinite)
    PARTS.forEach(function (p, i) {  // the legend on two rows: it fits the chart's width
      var lx = left + (i % 3) * 130, ly = 4 + Math.floor(i / 3) * 18;
      svg.appendChild(el("rect", { x: lx, y: ly, width: 10, height: 10, fill: p[1] }));
      svg.appendChild(el("text", { x: lx + 14, y: ly + 10, "font-size": 12 }, p[0]));
    });
    rows.forEach(function (r, i) {
      var y = top + i * (barH + gap);
      svg.appendChild(el("text", { x: left - 6, y: y + barH * 0.7, "text-anchor": "end", "font-size": 12 },
        r.name.length > 18 ? r.name.slice(0, 17) + "…" : r.name));
      if (r.total === null) {
        svg.appendChild(el("text", { x: left + 4, y: y + barH * 0.7, "font-size": 12, fill: "#C44E52" }, "no cost (" + r.status + ")"));
        return;
      }
      var bx = left;
      PARTS.forEach(function (p) {
        var part = partValue(r.breakdown, p[0]);
        var w = Math.max(0, part / max * span);
        var rect = el("rect", { x: bx, y: y, width: w, height: barH, fill: p[1], "class": "part-" + p[0] });
        rect.appendChild(el("title", {}, p[0] + ": " + money(part)));
        svg.appendChild(rect);
        bx += w;
      });
      svg.appendChild(el("text", { x: bx + 6, y: y + barH * 0.7, "font-size": 12 }, money(r.total)));
    });
    holder.appendChild(svg);
  }

  function partValue(b, name) { return name === "engine" ? b.compute - b.energy : b[name]; }

  // Check the inputs as the ledger would; price them only when it would accept them.
  function render() {
    var err = calc.validateAll(data, base), box = document.getElementById("calc-error");
    document.querySelectorAll("#calc-form input").forEach(function (input) {
      input.classList.toggle("invalid", !!err && input.dataset.path === JSON.stringify(err.path));
    });
    var rows = err ? null : calc.priceAll(data, base, load);
    var wrong = rows && calc.problem(rows, data.reference);
    box.hidden = !err && !wrong;
    box.textContent = err ? "The ledger rejects these inputs — " + err.message : wrong ? "No cost shown: " + wrong + "." : "";
    document.getElementById("calc-results").classList.toggle("rejected", !!(err || wrong));
    if (err || wrong) {
      document.querySelector("#calc-table tbody").textContent = "";
      document.getElementById("calc-chart").textContent = "";
      document.getElementById("calc-answer").textContent = "";
      return;
    }
    renderAnswer(rows);
    renderTable(rows);
    renderChart(rows);
  }

  function para(holder, cls, parts) {  // parts: strings, or [text] for bold
    var p = document.createElement("p");
    p.className = cls;
    parts.forEach(function (t) {
      if (Array.isArray(t)) { var b = document.createElement("b"); b.textContent = t[0]; p.appendChild(b); }
      else p.appendChild(document.createTextNode(t));
    });
    holder.appendChild(p);
  }

  // The answer at these inputs: what to run, its cost, the saving against the baseline (point values), and the
  // verdict: the ledger's own while the inputs are the file's; else the point comparison, and what it needs.
  function renderAnswer(rows) {
    var holder = document.getElementById("calc-answer");
    holder.textContent = "";
    var a = calc.pointAnswer(rows, data.reference, data.material);
    if (!a) {
      para(holder, "calc-rec", ["No configuration has a comparable, feasible cost at these inputs."]);
      return;
    }
    para(holder, "calc-rec", ["At these inputs: run ", [a.recommended], ", ", [money(a.cost)],
      " per accepted task (point estimate, " + a.load + ")."]);
    if (a.baseline === a.recommended) {
      para(holder, "calc-saving", ["It is the baseline (" + a.baseline + "): nothing to save against it."]);
    } else if (a.baseline) {
      var word = a.saving_per_task >= 0 ? "Saves " : "Costs ";
      para(holder, "calc-saving", [word + money(Math.abs(a.saving_per_task)) + " per task against " + a.baseline +
        " (" + money(a.baseline_cost) + (a.baseline_status ? ", " + a.baseline_status : "") + "), " + money(Math.abs(a.saving_per_month)) + " a month at " +
        (a.tasks_per_month < 1e15 ? a.tasks_per_month.toLocaleString("en-US") : calc.pyG(a.tasks_per_month)) +
        " tasks a month."]);
    } else if (data.reference) {
      para(holder, "calc-saving", ["The baseline " + data.reference + " has no comparable cost here: no saving against it."]);
    }
    if (a.sources && Object.keys(a.sources).every(function (k) { return isFinite(a.sources[k]); })) {
      para(holder, "calc-sources", ["By source (point values, a month): " + ["speed", "energy", "quality", "rest"].map(
        function (k) { return k + " " + money(a.sources[k] * a.tasks_per_month); }).join(" · ") +
        ". The ledger credits a source only where its 95% interval excludes 0 (the answer above)."]);
    }
    var rec = rows.filter(function (r) { return r.name === a.recommended; })[0];
    if (rec.breakdown.escalation > 0.999) {
      para(holder, "calc-escalation", ["At a pass rate of " + pct(rec.breakdown.pass_rate) + " nearly every task " +
        "is escalated (P(escalation) " + pct(rec.breakdown.escalation) + "): the cost is about " +
        Math.round(rec.breakdown.attempts) + " attempts plus a person's fix. (A pass rate of exactly 0 is refused: " +
        "the ledger counts no task as accepted then.)"]);
    }
    var ledger = (data.answers || {})[scenario || ""];
    var verdict;
    if (ledger && load === null && JSON.stringify(base) === start) {
      verdict = ["The cost file's inputs: the ledger's verdict holds (paired Monte Carlo, 95%): " + ledger.confidence];
    } else if (a.next === null) {
      verdict = ["The only configuration priced."];
    } else {
      var gap = a.gap === 0 ? a.next + " costs the same" : a.next + " is next, at " +
        (a.gap_rel === null ? "" : calc.versus(a.gap_rel) + ", ") + "+" + money(a.gap) + " per task";
      verdict = a.within
        ? ["Point comparison: " + gap + ", within " + pct(data.material) + ": the ledger would call them a tie " +
           "whatever the noise."]
        : ["Point comparison: " + gap + ". Whether that is beyond the noise needs the ledger's paired Monte Carlo " +
           "samples, which this page does not have: write these inputs to a cost file and run ",
           ["specledger cost RUN_DIR --inputs FILE"], "."];
    }
    para(holder, "calc-verdict", verdict);
  }

  buildForm();
  render();
})();

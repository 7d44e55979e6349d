// The report's interactive calculator: cost inputs as fields; table and chart recomputed with
// calculator.js (the ledger's formulas) on every edit. No network, no libraries.
(function () {
  "use strict";
  var calc = window.SpecLedgerCalc;
  var data = JSON.parse(document.getElementById("ledger-data").textContent).calculator;
  var start = JSON.stringify(data.base);
  var base = JSON.parse(start);
  var SVGNS = "http://www.w3.org/2000/svg";
  var PARTS = [["compute", "#4C72B0"], ["tools", "#64B5CD"], ["labour", "#DD8452"], ["maintenance", "#55A868"]];

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

  // Fields the cost file may leave out (null: the run's value, the default, or no objective).
  var NULLABLE = { pass_rate: 1, demand_rps: 1, device_count: 1, utilisation: 1, engineer_wage_per_hour: 1,
    ttft_p95_s: 1, tpot_p95_s: 1, e2e_p95_s: 1, task_s: 1, power_watts: 1, price_per_device_hour: 1,
    purchase_price: 1, lifetime_years: 1, energy_price_per_kwh: 1, pue: 1 };

  function getPath(obj, path) { return path.reduce(function (o, k) { return o[k]; }, obj); }
  function setPath(obj, path, v) { getPath(obj, path.slice(0, -1))[path[path.length - 1]] = v; }

  function money(v) {
    if (v === null || v === undefined || !isFinite(v)) return "∞";
    if (v === 0) return "$0";
    if (Math.abs(v) >= 100) return "$" + Math.round(v).toLocaleString("en-US");
    if (Math.abs(v) < 1) return "$" + v.toPrecision(3);
    return "$" + v.toFixed(2);
  }

  function pct(v) { return v === null || v === undefined || !isFinite(v) ? "–" : Math.round(v * 100) + "%"; }

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
      input.min = "0";
      input.id = id;
      var initial = getPath(base, path);
      input.value = initial === null || initial === undefined ? "" : String(initial);
      input.placeholder = "not set";
      input.dataset.path = JSON.stringify(path);
      input.addEventListener("input", function () {
        var v = Number(input.value);
        if (input.value.trim() === "" && NULLABLE[path[path.length - 1]]) {  // cleared: not set
          input.classList.remove("invalid");
          setPath(base, path, null);
          render();
          return;
        }
        var bad = input.value.trim() === "" || !isFinite(v) || v < 0 ||
          (path[1] === "device_count" && (v < 1 || v !== Math.trunc(v))) ||
          (path[1] === "pass_rate" && (v <= 0 || v > 1)) || (path[1] === "utilisation" && (v <= 0 || v > 1)) ||
          (path[1] === "tasks_per_month" && v <= 0);
        input.classList.toggle("invalid", bad);
        if (bad) return;
        setPath(base, path, path[1] === "retries" ? Math.trunc(v) : v);
        render();
      });
      row.appendChild(span);
      row.appendChild(input);
      sections[sec].appendChild(row);
    });
    document.getElementById("calc-reset").addEventListener("click", function () {
      base = JSON.parse(start);
      form.querySelectorAll("input, select").forEach(function (input) {
        var path = JSON.parse(input.dataset.path), v = getPath(base, path);
        if (input.dataset.choice) input.value = String(Math.max(0, CHOICES[path.join(".")].indexOf(v === undefined ? null : v)));
        else input.value = v === null || v === undefined ? "" : String(v);
        input.classList.remove("invalid");
      });
      render();
    });
  }

  function cell(tr, text, cls, value) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    if (value !== undefined) td.dataset.value = value === null || !isFinite(value) ? "inf" : String(value);
    tr.appendChild(td);
    return td;
  }

  function renderTable(rows) {
    var body = document.querySelector("#calc-table tbody");
    body.textContent = "";
    rows.forEach(function (r) {
      var b = r.breakdown, tr = document.createElement("tr");
      tr.dataset.config = r.name;
      tr.className = "verdict-" + r.verdict.replace(/ /g, "-");
      cell(tr, r.name + " @" + r.load);
      cell(tr, pct(b.pass_rate), "num");
      cell(tr, b.attempts.toFixed(3), "num");
      cell(tr, pct(b.escalation), "num");
      cell(tr, money(b.cost_per_call), "num calc-per-call", b.cost_per_call);
      cell(tr, money(b.per_million_tokens), "num");
      cell(tr, money(r.total), "num calc-total", r.total);
      cell(tr, r.shares ? pct(r.shares.compute) + " / " + pct(r.shares.labour) + " / " + pct(r.shares.maintenance) : "–", "num");
      cell(tr, r.verdict + (r.verdict_detail ? " (" + r.verdict_detail + ")" : ""), "calc-verdict");
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
    var barH = 22, gap = 8, left = 170, width = 720, top = 26;
    var height = top + rows.length * (barH + gap) + 30;
    var svg = el("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img",
      "aria-label": "cost per accepted task, by part" });
    var max = priced.reduce(function (m, r) { return Math.max(m, r.total); }, 0) || 1;
    var scale = (width - left - 80) / max;
    var x = left;
    PARTS.forEach(function (p) {
      svg.appendChild(el("rect", { x: x, y: 4, width: 10, height: 10, fill: p[1] }));
      svg.appendChild(el("text", { x: x + 14, y: 13, "font-size": 11 }, p[0]));
      x += 110;
    });
    rows.forEach(function (r, i) {
      var y = top + i * (barH + gap);
      svg.appendChild(el("text", { x: left - 6, y: y + barH * 0.7, "text-anchor": "end", "font-size": 12 }, r.name));
      if (r.total === null) {
        svg.appendChild(el("text", { x: left + 4, y: y + barH * 0.7, "font-size": 12, fill: "#C44E52" }, "∞ (" + r.verdict + ")"));
        return;
      }
      var bx = left;
      PARTS.forEach(function (p) {
        var w = Math.max(0, r.breakdown[p[0]] * scale);
        var rect = el("rect", { x: bx, y: y, width: w, height: barH, fill: p[1], "class": "part-" + p[0] });
        rect.appendChild(el("title", {}, p[0] + ": " + money(r.breakdown[p[0]])));
        svg.appendChild(rect);
        bx += w;
      });
      svg.appendChild(el("text", { x: bx + 6, y: y + barH * 0.7, "font-size": 12 }, money(r.total)));
    });
    holder.appendChild(svg);
  }

  function render() {
    var rows = calc.priceAll(data, base);
    renderTable(rows);
    renderChart(rows);
  }

  buildForm();
  render();
})();

"""What the report rests on, said where a reader looks: the first screen's facts (models, hardware, workload, sample
sizes, sampling, cost inputs) and the evidence section (the run's files, the commands that reproduce it, the version,
the gates, borrowed pass rates, per-kind pass rates on the graded set). No absolute path of the machine that wrote
the report appears in it: files are linked relative to the report, other paths by their names."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path, PureWindowsPath
from urllib.parse import quote

import yaml

from specledger import __version__
from specledger.ledger.inputs import DEFAULT_COSTS
from specledger.ledger.price import LedgerResult
from specledger.records.config import QUALITY_LEVEL
from specledger.records.pairing import precision_label
from specledger.records.results import RunResult

RUN_FILES = (("run.json", "the run: configurations, machine, gates, aggregates"),
             ("ledger.json", "the ledger: every priced row, its intervals, the answer"),
             ("summary.csv", "one row per configuration and load level"),
             ("requests.jsonl", "every request: timings, tokens, output, grade"))


def public_name(path: str) -> str:
    """A path as the report may show it: an absolute one by its file name (a FORMAT: prefix kept); relative paths,
    model names (org/name) and built-in sets as they are."""
    fmt, sep, rest = path.partition(":")
    if not sep or not fmt.replace("-", "").replace("_", "").isalnum() or len(fmt) == 1:  # no FORMAT: (C:\ is a drive)
        fmt, sep, rest = "", "", path
    if not (rest.startswith(("/", "~", "\\")) or re.match(r"^[A-Za-z]:[\\/]", rest)):
        return path
    name = PureWindowsPath(rest).name if "\\" in rest else Path(rest).name
    return f"{fmt}{sep}{name}"


def is_example(source: str) -> bool:
    """The cost inputs are the package's example file (default_costs.yaml), wherever it was installed."""
    return source.startswith(str(DEFAULT_COSTS)) or Path(source.split(" [")[0]).name == DEFAULT_COSTS.name


def _counts(values: Iterable[int]) -> str:
    """"7" or "6–14": one count, or the range of several."""
    vs = sorted(set(values))
    return "–" if not vs else str(vs[0]) if len(vs) == 1 else f"{vs[0]}–{vs[-1]}"


def _models(ledger: LedgerResult, run: RunResult | None) -> str:
    targets: dict[str, list[str]] = {}
    for m in ledger.measurements:
        precs = targets.setdefault(m.model or "?", [])
        if m.precision and m.precision not in precs:
            precs.append(m.precision)
    text = "; ".join(f"{public_name(model)} ({', '.join(p)})" if p else public_name(model) for model, p in targets.items())
    drafts: dict[str, list[str]] = {}
    for c in run.configs if run is not None else []:
        d = c.spec.get("draft")
        if isinstance(d, dict) and d.get("model"):
            label = f"{public_name(str(d['model']))} {precision_label(d.get('dtype'), d.get('quant'), d.get('group_size'), d.get('activations') or 16)}"
            drafts.setdefault(label, []).append(c.name)
    if drafts:
        text += "; draft model " + "; ".join(f"{label} ({', '.join(names)})" for label, names in drafts.items())
    return text


def _hardware(run: RunResult | None) -> str:
    if run is None:
        return "not recorded (run.json unreadable)"
    c = run.conditions
    return " · ".join(b for b in (c.gpu, c.cpu_model, f"{c.cpu_count} CPUs" if c.cpu_count else None,
                                  f"{c.torch_threads} torch thread{'s' if c.torch_threads != 1 else ''}" if c.torch_threads else None) if b) or "not recorded"


def _workload(run: RunResult | None) -> str:
    w = run.workload if run is not None else None
    if w is None:
        return "not recorded"
    kinds = len(w.by_kind)
    return (f"{public_name(w.spec)} ({w.format}{', ' + w.chosen if w.chosen and w.chosen != 'named' else ''}): "
            f"{w.questions} question{'s' if w.questions != 1 else ''}, {kinds} task kind{'s' if kinds != 1 else ''}")


def sample_sizes(ledger: LedgerResult) -> dict:
    """Requests behind each configuration and load level (speed), and graded items behind each pass rate that was
    measured (quality); which configurations borrow another's."""
    per_level = [m.requests_completed + m.requests_failed for m in ledger.measurements]
    graded = {m.name: m.graded for m in ledger.measurements if m.graded and m.grades_from in ("", m.name)}
    borrowed = {m.name: m.grades_from for m in ledger.measurements if m.graded and m.grades_from not in ("", m.name)}
    loads = sorted({m.load for m in ledger.measurements}, key=lambda x: (len(x), x))
    return {"requests": _counts(per_level), "loads": loads, "graded": _counts(graded.values()),
            "graded_configs": sorted(graded), "borrowed": borrowed}


def _sampling(ledger: LedgerResult, run: RunResult | None) -> str:
    kinds = sorted({m.sampling for m in ledger.measurements if m.sampling})
    configs = [c for c in (run.conditions.config.get("configs", []) if run is not None else []) if isinstance(c, dict)]
    if not kinds:  # measurements from before the arm's sampling was kept: the run configuration says
        temps = sorted({float((c.get("sampling") or {}).get("temperature", 0.0)) for c in configs})
        kinds = ["greedy" if t == 0 else f"T={t:g}" for t in temps]
    text = ", ".join(kinds) if kinds else "not recorded"
    if run is not None:
        tokens = sorted({c["max_tokens"] for c in configs if isinstance(c.get("max_tokens"), int)})
        if tokens:
            text += f", up to {_counts(tokens)} new tokens per answer"
        seed = run.conditions.seed
        text += f" (seed {seed})"
    return text


def first_screen(ledger: LedgerResult, run: RunResult | None) -> dict:
    """The facts the first screen names, as (label, text) rows, and whether the cost inputs are the example file."""
    n = sample_sizes(ledger)
    speed = f"{n['requests']} requests per configuration and level ({', '.join(n['loads'])})"
    quality = (f"{n['graded']} graded items ({', '.join(n['graded_configs'])}"
               + ("; the others borrow their target's: lossless" if n["borrowed"] else "") + ")"
               if n["graded_configs"] else "no graded items")
    example = is_example(ledger.inputs_source)
    scenario = ledger.inputs_source.partition(" [")[2].rstrip("]")
    inputs = ("example costs" if example else public_name(ledger.inputs_source.split(" [")[0])) + (
        f" (scenario {scenario})" if scenario else "")
    return {"rows": [("Model", _models(ledger, run)), ("Hardware", _hardware(run)), ("Workload", _workload(run)),
                     ("Sample", f"speed: {speed}; quality: {quality}"), ("Sampling", _sampling(ledger, run))],
            "inputs": inputs, "example": example, "speed_requests": n["requests"], "graded": n["graded"],
            "mc": f"{ledger.samples} Monte Carlo samples (seed {ledger.seed})"}


def run_files(run_dir: Path, out_dir: Path | None) -> list[dict]:
    """The run's files that exist, each linked relative to where the report is written (ledger.json: the one beside
    the report where there is one, which `specledger report` writes with it)."""
    here = Path(out_dir) if out_dir is not None else Path(run_dir)
    out = []
    for name, what in RUN_FILES:
        path = here / name if name == "ledger.json" and (here / name).is_file() else Path(run_dir) / name
        if path.is_file():
            rel = os.path.relpath(path.resolve(), here.resolve())
            out.append({"name": name, "href": quote(Path(rel).as_posix()), "what": what,
                        "size": f"{path.stat().st_size / 1024:,.0f} KiB"})
    return out


def reproduce(ledger: LedgerResult, run: RunResult | None) -> dict:
    """Commands that give this report again from the run's files, run in the run's directory (priced with the same
    seed: the same numbers), and that measure it again from its configuration as resolved (offered as a download,
    the report staying one file)."""
    inputs = "" if is_example(ledger.inputs_source) else f" --inputs {public_name(ledger.inputs_source.split(' [')[0])}"
    cmds = {"report": f"specledger report .{inputs} --samples {ledger.samples} --seed {ledger.seed}"}
    config = run.conditions.config if run is not None else {}
    if config:
        text = yaml.safe_dump(json.loads(json.dumps(config)), sort_keys=False)
        cmds["measure"] = f"specledger compare --config run-config.yaml{inputs} --samples {ledger.samples}"
        cmds["config_href"] = "data:text/yaml;charset=utf-8," + quote(text)
    return cmds


def versions(run: RunResult | None) -> str:
    """The version that measured the run and the one that wrote the report."""
    measured = run.conditions.specledger if run is not None else "?"
    return (f"specledger {measured}" + ("" if measured == __version__ else f" (report written by {__version__})")
            + ("" if run is None or not run.conditions.torch else f" · torch {run.conditions.torch}")
            + ("" if run is None else f" · Python {run.conditions.python}"))


def gates(run: RunResult | None) -> list[dict]:
    """Every gate each configuration went through (lossless, quantization, ...) with its outcome and reason."""
    if run is None:
        return []
    return [{"config": c.name, "gate": g.name, "passed": "passed" if g.passed else "not checked" if g.passed is None
             else "failed", "reason": g.reason} for c in run.configs for g in c.gates]


def graded_by_kind(run: RunResult | None) -> dict | None:
    """Pass rates per task kind on the graded set (the "quality" level), per configuration graded there."""
    if run is None:
        return None
    graded = [(c.name, lr) for c in run.configs for lr in c.loads if lr.load == QUALITY_LEVEL]
    kinds = sorted({k for _, lr in graded for k, a in lr.by_kind.items() if a.graded})
    if not kinds:
        return None
    rows = []
    for name, lr in graded:
        cells = []
        for k in kinds:
            a = lr.by_kind.get(k)
            cells.append("–" if a is None or not a.graded else f"{a.passed}/{a.graded} ({a.passed / a.graded:.0%})")
        a = lr.aggregate
        rows.append({"config": name, "cells": cells,
                     "total": "–" if not a.graded else f"{a.passed}/{a.graded} ({a.passed / a.graded:.0%})"})
    stand_in = {c.name: c.quality_source for c in run.configs if c.quality_source and c.quality_source != c.name}
    return {"kinds": kinds, "rows": rows, "borrowed": stand_in}

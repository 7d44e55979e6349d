"""Workloads: the dispatcher that picks the reader for a spec and says what was read.

Readers (one module per format, bench/formats/): Spec-Bench question files (the built-in set uses it), ShareGPT,
OpenAI chat JSONL, CSV, plain text and timed traces; plus synthetic prompts of controlled length.
A spec is "builtin", "builtin-quick", "synthetic:in=..,out=..,n=..", a fetched registry workload ("humaneval":
bench/datasets.py), "FORMAT:PATH" or a PATH whose format is detected from its first record (the run says which
was chosen). Selection streams (bench/selection.py).

The record and its task kinds are in records/question.py, the synthetic filler in bench/synthetic.py.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specledger.bench.datasets import KNOWN_WORKLOADS, require
from specledger.bench.formats import detect, spec_bench
from specledger.bench.formats.lines import BadLines
from specledger.records.question import KINDS, Question, ReadOptions
from specledger.records.config import WorkloadSettings
from specledger.records.results import WorkloadInfo
from specledger.bench.selection import select
from specledger.bench.synthetic import synthetic_prompt
from specledger.errors import BadInput

BUILTIN_FILE = "builtin.jsonl"


def builtin_path() -> Path:
    return Path(str(resources.files("specledger"))) / "data" / "workloads" / BUILTIN_FILE


def _quick(questions: list[Question]) -> list[Question]:
    """The first question of each kind: a smoke-test workload that still touches every grader."""
    firsts: dict[str, Question] = {}
    for q in questions:
        firsts.setdefault(q.kind, q)
    return [q for q in questions if firsts.get(q.kind) is q]


def _synthetic(spec: str) -> list[Question]:
    """n prompts of `in` tokens, each answered with `out` tokens; in=1024+4096 (several lengths): n prompts of each,
    a long-input sweep (`bench --input-tokens`) whose lengths count the whole prompt, chat template included."""
    body = spec.split(":", 1)[1]
    params: dict[str, list[int]] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("in", "out", "n", "seed"):
            raise BadInput(f"synthetic workload {spec!r}: bad parameter {item!r} (expected in=, out=, n=, seed=)")
        try:
            params[key] = [int(v) for v in value.split("+")] if key == "in" else [int(value)]
        except ValueError:
            raise BadInput(f"synthetic workload {spec!r}: {key} must be an integer, got {value!r}") from None
    for key in ("in", "out"):
        if key not in params:
            raise BadInput(f"synthetic workload {spec!r}: missing {key}= (e.g. synthetic:in=256,out=128,n=8)")
    lengths, (out,) = params["in"], params["out"]
    n, seed = params.get("n", [8])[0], params.get("seed", [0])[0]
    for key, count in (("in", min(lengths)), ("out", out), ("n", n)):
        if count < 1:
            raise BadInput(f"synthetic workload {spec!r}: {key} must be >= 1, got {count}")
    sweep = len(lengths) > 1
    return [
        Question(
            question_id=f"synthetic-{length}-{i}" if sweep else f"synthetic-{i}",
            category="synthetic",
            kind="summarization",
            turns=(synthetic_prompt(length, seed * 1_000_003 + j * 7919 + i),),
            max_tokens=out,
            min_tokens=out,
            prompt_tokens=length if sweep else None,
        )
        for j, length in enumerate(lengths)
        for i in range(n)
    ]


# --- dispatcher ----------------------------------------------------------------------------------------


@dataclass
class Workload:
    questions: list[Question]
    info: WorkloadInfo


def _selection_text(categories, per_category, sample, limit, seed) -> str:
    parts = [categories and f"categories {', '.join(categories)}",
             per_category and f"{per_category} per category (seed {seed})",
             sample and f"random sample of {sample} (seed {seed})", limit and f"first {limit}"]
    return "; ".join(p for p in parts if p) or "all"


def open_workload(
    spec: str,
    *,
    categories: list[str] | None = None,
    per_category: int | None = None,
    sample: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    on_bad_line: str = "stop",
    kind: str | None = None,
    prompt_column: str | None = None,
) -> Workload:
    """Read a workload (see the module docstring for specs; "builtin-graded" is bench/graded.py) and say what
    was read, chosen and skipped.

    Order is the file's order; filters, then the per-category sample, then the random sample, then `limit`
    (the first N) apply, all while streaming.
    """
    if kind is not None and kind not in KINDS:
        raise BadInput(f"--kind {kind!r} is not one of {', '.join(KINDS)}")
    for name, value in (("limit", limit), ("sample", sample), ("per_category", per_category)):
        if value is not None and value < 1:
            raise BadInput(f"{name} must be >= 1, got {value}")
    opts = ReadOptions(kind=kind, prompt_column=prompt_column)
    bad = BadLines(on_bad_line)
    source: str | None = None
    if spec == "builtin":
        fmt, chosen, source = "spec-bench", "built-in set", str(builtin_path())
        stream: Callable[[BadLines], Iterator[Question]] = lambda b: spec_bench.read(builtin_path(), b, opts)
    elif spec == "builtin-quick":
        fmt, chosen, source = "spec-bench", "built-in set, first question of each kind", str(builtin_path())
        stream = lambda b: iter(_quick(list(spec_bench.read(builtin_path(), b, opts))))
    elif spec == "builtin-graded":
        from specledger.bench.graded import graded_questions

        fmt, chosen = "graded", f"built-in graded items (seed {seed})"
        stream = lambda b: iter(graded_questions(seed=seed))
    elif spec.startswith("synthetic:"):
        fmt, chosen = "synthetic", "synthetic lengths"
        stream = lambda b: iter(_synthetic(spec))
    elif spec in KNOWN_WORKLOADS:
        from specledger.bench.formats import code

        fmt, chosen, fetched = "code", KNOWN_WORKLOADS[spec].description, require(spec)
        source = str(fetched)
        stream = lambda b: code.read(fetched, b, opts)
    else:
        fmt, path, chosen = detect.resolve(spec)
        source = str(path)
        read = detect.reader(fmt)
        stream = lambda b: read(path, b, opts)
    picked = select(stream, bad, categories=categories, per_category=per_category, sample=sample, limit=limit,
                    seed=seed)
    questions = picked.questions
    if bad.total > len(bad.examples):
        print(f"warning: skipped {bad.total - len(bad.examples)} more line(s) of {source}", file=sys.stderr)
    if not questions:
        raise BadInput(f"workload {spec!r} is empty after filtering"
                       + (f" ({bad.total} line(s) skipped)" if bad.total else ""))
    info = WorkloadInfo(
        spec=spec, format=fmt, chosen=chosen, source=source, read=picked.read, complete=picked.complete,
        selection=_selection_text(categories, per_category, sample, limit, seed), questions=len(questions),
        by_kind=dict(Counter(q.kind for q in questions)),
        with_reference=dict(Counter(q.kind for q in questions if q.reference or q.code)),
        skipped=dict(bad.skipped), skipped_examples=list(bad.examples),
        timed=any(q.arrival_s is not None for q in questions),
    )
    return Workload(questions=questions, info=info)


def load_workload(spec: str, **kwargs) -> list[Question]:
    """The questions of `open_workload(spec, ...)`."""
    return open_workload(spec, **kwargs).questions


def open_settings(ws: WorkloadSettings) -> Workload:
    """The questions a run configuration's `workload:` section names, and what was read."""
    return open_workload(ws.spec, categories=ws.categories, per_category=ws.per_category, sample=ws.sample,
                         limit=ws.limit, seed=ws.seed, on_bad_line=ws.on_bad_line, kind=ws.kind,
                         prompt_column=ws.prompt_column)

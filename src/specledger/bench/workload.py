"""Workloads: the question record every reader produces, and the dispatcher that picks the reader.

Readers (one module per format, bench/formats/): Spec-Bench question files (the built-in set uses it), ShareGPT,
OpenAI chat JSONL, CSV, plain text and timed traces; plus synthetic prompts of controlled length (below).
A spec is "builtin", "builtin-quick", "synthetic:in=..,out=..,n=..", "FORMAT:PATH" or a PATH whose format is
detected from its first record (the run says which was chosen). Selection streams (bench/selection.py).

Every question carries one of six task kinds (KINDS) so graders and per-kind reports need not guess from
free-form category names. Category -> kind:

- MT-Bench categories (writing, roleplay, reasoning, math, coding, extraction, stem, humanities) -> multi_turn.
  Note that MT-Bench's "math" is a two-turn chat (kind multi_turn); grade-school word problems are
  "math_reasoning" (kind math), as in Spec-Bench.
- translation, summarization, qa, math_reasoning, rag (Spec-Bench's names) and a few common aliases
  (_ALIASES) -> their kind.
- A record's own "kind" field, when it names one of KINDS, overrides the mapping; formats without categories
  take the kind given to the reader (--kind), else multi_turn.
- Any other category -> multi_turn: an open-ended chat question, graded only by explicit rules.

`reference` entries align with turns (Spec-Bench's convention): a string, or a tuple of acceptable answers;
see quality/graders.py for how they are read.

Synthetic questions (category "synthetic", kind summarization: "summarise these notes", no reference) have a
prompt of exactly `in` tokens for SmolLM2's Llama-family BPE tokenizer (tested; other Llama-family BPEs:
within a few percent) — the user message only: the chat template adds its own tokens (~30 for SmolLM2,
whose template inserts a default system prompt). `min_new_tokens` = `max_new_tokens` = `out`.
"""

from __future__ import annotations

import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specledger.bench.results import WorkloadInfo
from specledger.errors import BadInput

KINDS = ("multi_turn", "translation", "summarization", "qa", "math", "rag")

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")

_ALIASES = {
    "translation": "translation",
    "translate": "translation",
    "wmt": "translation",
    "summarization": "summarization",
    "summarisation": "summarization",
    "summary": "summarization",
    "cnn_dm": "summarization",
    "qa": "qa",
    "question_answering": "qa",
    "natural_questions": "qa",
    "math_reasoning": "math",
    "gsm8k": "math",
    "rag": "rag",
    "retrieval": "rag",
}

BUILTIN_FILE = "builtin.jsonl"

# One entry per turn: "" (none), a string (rules and "|"-separated alternatives allowed), or a tuple of
# acceptable answers taken literally (Spec-Bench's RAG lines).
Reference = tuple[str | tuple[str, ...], ...]


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    kind: str
    turns: tuple[str, ...]
    reference: Reference | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    system: str | None = None  # a system message sent before the first turn (chat and ShareGPT records)
    arrival_s: float | None = None  # timed traces: seconds after the trace's first request


@dataclass(frozen=True)
class ReadOptions:
    """What a reader cannot learn from a record: the task kind of records without one, the CSV prompt column."""

    kind: str | None = None
    prompt_column: str | None = None

    def kind_for(self, category: str | None = None, explicit: str | None = None) -> str:
        if explicit in KINDS:
            return explicit
        if category:
            return kind_of(category, self.kind)
        return self.kind or "multi_turn"


def kind_of(category: str, explicit: str | None = None) -> str:
    """The task kind of a category (see the module docstring for the mapping)."""
    if explicit in KINDS:
        return explicit
    name = category.strip().lower()
    if name in MT_BENCH_CATEGORIES:
        return "multi_turn"
    return _ALIASES.get(name, "multi_turn")


def read_questions(path: Path, *, on_bad_line: str = "stop") -> list[Question]:
    """Every question of a Spec-Bench .jsonl file (see formats/spec_bench.py)."""
    from specledger.bench.formats import spec_bench
    from specledger.bench.formats.lines import BadLines

    return list(spec_bench.read(Path(path), BadLines(on_bad_line), ReadOptions()))


def builtin_path() -> Path:
    return Path(str(resources.files("specledger"))) / "data" / "workloads" / BUILTIN_FILE


def _quick(questions: list[Question]) -> list[Question]:
    """The first question of each kind: a smoke-test workload that still touches every grader."""
    firsts: dict[str, Question] = {}
    for q in questions:
        firsts.setdefault(q.kind, q)
    return [q for q in questions if firsts.get(q.kind) is q]


# --- synthetic -----------------------------------------------------------------------------------------
# Filler made of common English words that are one token (with a leading space) in Llama-family BPE
# vocabularies, so the estimate below (one token per word, punctuation mark and newline) is exact for
# SmolLM2's tokenizer (tested) and within a few percent for other Llama-family BPEs.

_ADJ = "small large old new quiet bright dark warm cold early late long short green blue red yellow".split()
_NOUN = (
    "river market garden village morning evening winter summer teacher farmer doctor student city road "
    "bridge house school window table letter story music water light stone field forest mountain harbor "
    "station train boat paper bread apple coffee friend family child worker report plan question answer"
).split()
_VERB = "walks carries builds opens closes finds keeps brings reads writes watches follows paints counts sells buys".split()
_PREP = "of to in on for with at from by about over under after before through near between".split()
_ADV = "slowly quickly often always never again together carefully happily".split()

SYNTHETIC_INSTRUCTION = "Read the notes below and write a detailed summary of them.\n\nNotes:"
_TOKEN_RE = re.compile(r"\w+|[^\w\s]|\n")


def estimate_tokens(text: str) -> int:
    """Words + punctuation marks + newlines: the token count of the synthetic filler."""
    return len(_TOKEN_RE.findall(text))


def truncate_tokens(text: str, n_tokens: int) -> str:
    """The start of `text` holding its first `n_tokens` estimated tokens."""
    marks = list(_TOKEN_RE.finditer(text))
    return text if n_tokens >= len(marks) else text[: marks[n_tokens - 1].end()] if n_tokens > 0 else ""


def _sentence(rng: random.Random, size: int) -> str:
    """Exactly `size` estimated tokens: words plus the final period."""
    if size < 4:  # only for prompts shorter than four tokens: no room for a period
        return " ".join(["The", rng.choice(_ADJ), rng.choice(_NOUN)][:size])
    n = size - 1
    words = ["The", rng.choice(_ADJ), rng.choice(_NOUN), rng.choice(_VERB)][:n]
    while len(words) < n:
        room = n - len(words)
        if room == 1:
            words.append(rng.choice(_ADV))
        elif room == 2 or rng.random() < 0.3:
            words += ["the", rng.choice(_NOUN)]
        else:
            words += [rng.choice(_PREP + ["and"]), "the", rng.choice(_NOUN)]
    return " ".join(words) + "."


def synthetic_prompt(n_tokens: int, seed: int, *, instruction: bool = True) -> str:
    """Deterministic filler text of about `n_tokens` tokens, the instruction included when it fits (and wanted:
    a trace's later prompt blocks are filler only)."""
    rng = random.Random(f"synthetic/{seed}")
    parts: list[str] = []
    budget = n_tokens
    if instruction and n_tokens >= 2 * estimate_tokens(SYNTHETIC_INSTRUCTION):
        parts.append(SYNTHETIC_INSTRUCTION)
        budget -= estimate_tokens(SYNTHETIC_INSTRUCTION)
    while budget > 0:
        if budget <= 15:
            size = budget
        elif budget <= 22:
            size = budget // 2
        else:
            size = rng.randint(7, 15)
        parts.append(_sentence(rng, size))
        budget -= size
    return " ".join(parts)


def _synthetic(spec: str) -> list[Question]:
    body = spec.split(":", 1)[1]
    params: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("in", "out", "n", "seed"):
            raise BadInput(f"synthetic workload {spec!r}: bad parameter {item!r} (expected in=, out=, n=, seed=)")
        try:
            params[key] = int(value)
        except ValueError:
            raise BadInput(f"synthetic workload {spec!r}: {key} must be an integer, got {value!r}") from None
    for key in ("in", "out"):
        if key not in params:
            raise BadInput(f"synthetic workload {spec!r}: missing {key}= (e.g. synthetic:in=256,out=128,n=8)")
    n, seed = params.get("n", 8), params.get("seed", 0)
    for key, value in (("in", params["in"]), ("out", params["out"]), ("n", n)):
        if value < 1:
            raise BadInput(f"synthetic workload {spec!r}: {key} must be >= 1, got {value}")
    return [
        Question(
            question_id=f"synthetic-{i}",
            category="synthetic",
            kind="summarization",
            turns=(synthetic_prompt(params["in"], seed * 1_000_003 + i),),
            max_new_tokens=params["out"],
            min_new_tokens=params["out"],
        )
        for i in range(n)
    ]


# --- dispatcher ----------------------------------------------------------------------------------------


@dataclass
class Workload:
    questions: list[Question]
    info: WorkloadInfo


def _selection_text(categories, per_category, sample, limit, seed) -> str:
    parts = []
    if categories:
        parts.append(f"categories {', '.join(categories)}")
    if per_category:
        parts.append(f"{per_category} per category (seed {seed})")
    if sample:
        parts.append(f"random sample of {sample} (seed {seed})")
    if limit:
        parts.append(f"first {limit}")
    return "; ".join(parts) or "all"


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
    from specledger.bench.formats import detect, spec_bench
    from specledger.bench.formats.lines import BadLines
    from specledger.bench.selection import select

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
        with_reference=dict(Counter(q.kind for q in questions if q.reference)),
        skipped=dict(bad.skipped), skipped_examples=list(bad.examples),
        timed=any(q.arrival_s is not None for q in questions),
    )
    return Workload(questions=questions, info=info)


def load_workload(spec: str, **kwargs) -> list[Question]:
    """The questions of `open_workload(spec, ...)`."""
    return open_workload(spec, **kwargs).questions

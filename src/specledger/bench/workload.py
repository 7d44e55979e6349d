"""Workloads: Spec-Bench question files, the built-in set, and synthetic prompts of controlled length.

Every question carries one of six task kinds (KINDS) so graders and per-kind reports need not guess from
free-form category names. Category -> kind:

- MT-Bench categories (writing, roleplay, reasoning, math, coding, extraction, stem, humanities) -> multi_turn.
  Note that MT-Bench's "math" is a two-turn chat (kind multi_turn); grade-school word problems are
  "math_reasoning" (kind math), as in Spec-Bench.
- translation, summarization, qa, math_reasoning, rag (Spec-Bench's names) and a few common aliases
  (_ALIASES) -> their kind.
- A record's own "kind" field, when it names one of KINDS, overrides the mapping.
- Any other category -> multi_turn: an open-ended chat question, graded only by explicit rules.

`reference` entries align with turns (Spec-Bench's convention); see quality/graders.py for how they are read.

Synthetic questions (category "synthetic", kind summarization: "summarise these notes", no reference) have a
prompt of exactly `in` tokens for SmolLM2's Llama-family BPE tokenizer (tested; other Llama-family BPEs:
within a few percent) — the user message only: the chat template adds its own tokens (~30 for SmolLM2,
whose template inserts a default system prompt). `min_new_tokens` = `max_new_tokens` = `out`.
"""

from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

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


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    kind: str
    turns: tuple[str, ...]
    reference: tuple[str, ...] | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None


def kind_of(category: str, explicit: str | None = None) -> str:
    """The task kind of a category (see the module docstring for the mapping)."""
    if explicit in KINDS:
        return explicit
    name = category.strip().lower()
    if name in MT_BENCH_CATEGORIES:
        return "multi_turn"
    return _ALIASES.get(name, "multi_turn")


class _Record(BaseModel):
    """One Spec-Bench line; unknown fields are tolerated."""

    model_config = ConfigDict(extra="ignore")
    question_id: StrictInt | StrictStr
    category: StrictStr
    turns: list[StrictStr]
    reference: list[StrictStr] | StrictStr | None = None
    kind: StrictStr | None = None


_UNION_MESSAGES = {
    "question_id": "must be an integer or a string",
    "reference": "must be a string or a list of strings",
}


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else "line"
    where = ".".join([name] + [str(p) for p in err["loc"][1:] if isinstance(p, int)])
    if err["type"] != "missing" and name in _UNION_MESSAGES:
        return f"field '{name}': {_UNION_MESSAGES[name]}"
    return f"field '{where}': {err['msg']}"


def _parse_line(text: str) -> Question:
    """Raises ValueError with a short reason when the line is not a valid question."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    try:
        rec = _Record.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(_describe(exc)) from None
    qid = str(rec.question_id).strip()
    if not qid:
        raise ValueError("field 'question_id': empty")
    if not rec.category.strip():
        raise ValueError("field 'category': empty")
    if not rec.turns:
        raise ValueError("field 'turns': no turns")
    for i, turn in enumerate(rec.turns):
        if not turn.strip():
            raise ValueError(f"field 'turns.{i}': empty turn")
    if rec.kind is not None and rec.kind not in KINDS:
        raise ValueError(f"field 'kind': {rec.kind!r} is not one of {', '.join(KINDS)}")
    ref = rec.reference
    if isinstance(ref, str):
        ref = [ref]
    return Question(
        question_id=qid,
        category=rec.category.strip(),
        kind=kind_of(rec.category, rec.kind),
        turns=tuple(rec.turns),
        reference=tuple(ref) if ref else None,
    )


def read_questions(path: Path, *, on_bad_line: str = "stop") -> list[Question]:
    """Read a Spec-Bench .jsonl file. Blank lines are ignored; a duplicate question_id is a bad line."""
    if on_bad_line not in ("stop", "skip"):
        raise BadInput(f"on_bad_line must be 'stop' or 'skip', got {on_bad_line!r}")
    if not path.is_file():
        raise BadInput(f"workload file not found: {path}")
    questions: list[Question] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                q = _parse_line(text)
                if q.question_id in seen:
                    raise ValueError(f"duplicate question_id {q.question_id!r}")
            except ValueError as exc:
                message = f"{path}:{lineno}: {exc}"
                if on_bad_line == "stop":
                    raise BadInput(message) from None
                print(f"warning: skipped {message}", file=sys.stderr)
                continue
            seen.add(q.question_id)
            questions.append(q)
    return questions


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


def synthetic_prompt(n_tokens: int, seed: int) -> str:
    """Deterministic filler text of about `n_tokens` tokens, the instruction included when it fits."""
    rng = random.Random(f"synthetic/{seed}")
    parts: list[str] = []
    budget = n_tokens
    if n_tokens >= 2 * estimate_tokens(SYNTHETIC_INSTRUCTION):
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


# --- selection -----------------------------------------------------------------------------------------


def _select(
    questions: list[Question], categories: list[str] | None, per_category: int | None, seed: int
) -> list[Question]:
    if categories:
        wanted = {c.strip().lower() for c in categories}
        available = {q.category.lower() for q in questions} | {q.kind for q in questions}
        unknown = sorted(wanted - available)
        if unknown:
            cats = sorted({q.category for q in questions})
            kinds = sorted({q.kind for q in questions})
            raise BadInput(
                f"unknown workload categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"available categories: {', '.join(cats)}; kinds: {', '.join(kinds)}"
            )
        questions = [q for q in questions if q.category.lower() in wanted or q.kind in wanted]
    if per_category is not None:
        if per_category < 1:
            raise BadInput(f"per_category must be >= 1, got {per_category}")
        keep: set[str] = set()
        for cat in sorted({q.category for q in questions}):
            ids = [q.question_id for q in questions if q.category == cat]
            # Seeded per category so filtering other categories does not change this one's sample.
            keep.update(random.Random(f"{seed}/{cat}").sample(ids, min(per_category, len(ids))))
        questions = [q for q in questions if q.question_id in keep]
    return questions


def load_workload(
    spec: str,
    *,
    categories: list[str] | None = None,
    per_category: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    on_bad_line: str = "stop",
) -> list[Question]:
    """Load a workload: "builtin", "builtin-quick", "builtin-graded" (bench/graded.py), a Spec-Bench .jsonl path,
    or "synthetic:in=..,out=..,n=..".

    Order is the file's order; filters, then the per-category sample, then `limit` (the first N) apply.
    """
    if spec == "builtin":
        questions = read_questions(builtin_path(), on_bad_line=on_bad_line)
    elif spec == "builtin-quick":
        questions = _quick(read_questions(builtin_path(), on_bad_line=on_bad_line))
    elif spec == "builtin-graded":
        from specledger.bench.graded import graded_questions

        questions = graded_questions(seed=seed)
    elif spec.startswith("synthetic:"):
        questions = _synthetic(spec)
    else:
        questions = read_questions(Path(spec).expanduser(), on_bad_line=on_bad_line)
    questions = _select(questions, categories, per_category, seed)
    if limit is not None:
        if limit < 1:
            raise BadInput(f"limit must be >= 1, got {limit}")
        questions = questions[:limit]
    if not questions:
        raise BadInput(f"workload {spec!r} is empty after filtering")
    return questions

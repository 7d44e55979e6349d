"""Spec-Bench question.jsonl: {"question_id", "category", "turns": [...], "reference"?, "kind"?} per line.

`reference` comes in every shape the published file uses: absent (qa, most multi-turn lines), a string, a list
with one string per turn (translation, summarization, math_reasoning), or a list per turn of several acceptable
answers (rag: [["a source of lumber", "purifying water", ...]]). A turn's entry stays a string when the file gives
one string, and becomes a tuple of acceptable answers when it gives a list; graders accept any of them.
`question_id` may be an integer or a string. Unknown fields are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from specledger.bench.formats.lines import BadLines, jsonl_records, read_questions_from, validated
from specledger.records.question import KINDS, Question, ReadOptions, Reference, kind_of

_Scalar = StrictStr | StrictInt | StrictFloat
_Entry = _Scalar | list[_Scalar] | None


class _Record(BaseModel):
    """One Spec-Bench line; unknown fields are tolerated."""

    model_config = ConfigDict(extra="ignore")
    question_id: StrictInt | StrictStr
    category: StrictStr
    turns: list[StrictStr]
    reference: list[_Entry] | _Scalar | None = None
    kind: StrictStr | None = None


_UNION_MESSAGES = {
    "question_id": "must be an integer or a string",
    "reference": "must be a string, a list with one entry per turn, or a list per turn of acceptable answers",
}


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else "line"
    where = ".".join([name] + [str(p) for p in err["loc"][1:] if isinstance(p, int)])
    if err["type"] != "missing" and name in _UNION_MESSAGES:
        return f"field '{name}': {_UNION_MESSAGES[name]}"
    return f"field '{where}': {err['msg']}"


def _text(x: Any) -> str:
    return x if isinstance(x, str) else f"{x:g}" if isinstance(x, float) else str(x)


def parse_reference(value: Any) -> Reference | None:
    """A reference in any published shape -> one entry per turn ("" = none; a tuple = acceptable answers)."""
    if value is None:
        return None
    if not isinstance(value, list):
        value = [value]
    entries: list[str | tuple[str, ...]] = []
    for entry in value:
        if isinstance(entry, list):
            alternatives = tuple(_text(a) for a in entry if a is not None and _text(a).strip())
            entries.append(alternatives or "")
        else:
            entries.append("" if entry is None else _text(entry))
    return tuple(entries) if any(entries) else None


def parse_record(obj: Any, lineno: int = 0) -> Question:
    """Raises ValueError with a short reason when the record is not a valid question."""
    rec = validated(_Record, obj, _describe)
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
    return Question(
        question_id=qid,
        category=rec.category.strip(),
        kind=kind_of(rec.category, rec.kind),
        turns=tuple(rec.turns),
        reference=parse_reference(rec.reference),
    )


def kind_hint(obj: Any) -> str | None:
    """The task kind of a line that failed, when it names a category: skipped lines are counted per kind."""
    if isinstance(obj, dict) and isinstance(obj.get("category"), str):
        return kind_of(obj["category"], obj.get("kind") if isinstance(obj.get("kind"), str) else None)
    return None


def read(path: Path, bad: BadLines, opts: ReadOptions | None = None) -> Iterator[Question]:
    """Stream a Spec-Bench .jsonl file. Blank lines are ignored; a duplicate question_id is a bad line."""
    return read_questions_from(path, jsonl_records(path), parse_record, bad, kind_hint=kind_hint)

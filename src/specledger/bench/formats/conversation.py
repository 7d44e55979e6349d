"""A recorded conversation (roles and texts) -> a Question: shared by the ShareGPT and chat readers.

User turns become the question's turns, in order; the assistant message recorded after each becomes that turn's
reference ("" when none), so a kind with a grader can compare against the recorded answer. Leading system
messages become the question's system message; consecutive messages of one role are joined by a blank line;
assistant messages before the first user message are dropped (nothing to answer). Any other role (tool,
function) makes the record unusable here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from specledger.bench.formats.lines import BadLines, first_record, json_array_records, jsonl_records, read_questions_from
from specledger.bench.formats.spec_bench import parse_reference
from specledger.records.question import Question, ReadOptions

USER = frozenset({"user", "human"})
ASSISTANT = frozenset({"assistant", "gpt", "chatgpt", "bard", "bing", "model"})
SYSTEM = frozenset({"system"})
REFERENCE_FIELDS = ("reference", "answer", "expected", "ideal", "target")


def record_id(obj: dict, lineno: int, *fields: str) -> str:
    for name in fields:
        value = obj.get(name)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return f"L{lineno}"


def token_limit(obj: dict, names: tuple[str, ...] = ("max_tokens", "max_completion_tokens", "max_new_tokens")
                ) -> int | None:
    for name in names:
        value = obj.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"field '{name}': must be a positive integer, got {value!r}")
        return value
    return None


def explicit_reference(obj: dict, turns: int) -> tuple | None:
    """A reference/answer field: a string is the last turn's; a list of one entry per turn aligns with turns;
    any other list of strings is the last turn's acceptable answers."""
    for name in REFERENCE_FIELDS:
        if name not in obj or obj[name] is None:
            continue
        value = obj[name]
        if isinstance(value, list) and len(value) == turns and turns > 1:
            ref = parse_reference(value)
        elif isinstance(value, list):
            ref = parse_reference([value])
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            ref = parse_reference(value)
        else:
            raise ValueError(f"field '{name}': must be a string or a list of strings")
        if ref is None:
            return None
        return ("",) * (turns - len(ref)) + ref if len(ref) < turns else ref[:turns]
    return None


def to_question(qid: str, messages: list[tuple[str, str]], *, category: str | None, explicit_kind: Any,
                opts: ReadOptions, default_category: str, record: dict | None = None,
                max_tokens: int | None = None, min_tokens: int | None = None) -> Question:
    """`record`: where an explicit reference/answer field is looked for (else the recorded replies)."""
    system: list[str] = []
    turns: list[str] = []
    answers: list[str] = []
    last = None
    for i, (role, text) in enumerate(messages):
        role = role.strip().lower()
        if role in SYSTEM:
            if turns:
                raise ValueError(f"message {i}: a system message after the first user turn is not supported")
            system.append(text)
        elif role in USER:
            if not text.strip():
                raise ValueError(f"message {i}: empty user turn")
            if last == "user":
                turns[-1] += "\n\n" + text
            else:
                turns.append(text)
                answers.append("")
            last = "user"
        elif role in ASSISTANT:
            if turns:
                answers[-1] = f"{answers[-1]}\n\n{text}" if answers[-1] else text
            last = "assistant"
        else:
            raise ValueError(f"message {i}: role {role!r} is not supported (user, assistant, system)")
    if not turns:
        raise ValueError("no user turn")
    if category is not None and not (isinstance(category, str) and category.strip()):
        raise ValueError("field 'category': must be a non-empty string")
    kind = opts.kind_for(category, explicit_kind if isinstance(explicit_kind, str) else None)
    explicit = explicit_reference(record, len(turns)) if record is not None else None
    refs = explicit if explicit is not None else tuple(answers)
    return Question(
        question_id=qid, category=(category or default_category).strip(), kind=kind, turns=tuple(turns),
        reference=refs if any(refs) else None, max_tokens=max_tokens, min_tokens=min_tokens,
        system="\n\n".join(system) if system else None,
    )


def kind_hint(obj: Any, opts: ReadOptions) -> str:
    category = obj.get("category") if isinstance(obj, dict) else None
    explicit = obj.get("kind") if isinstance(obj, dict) else None
    return opts.kind_for(category if isinstance(category, str) else None,
                         explicit if isinstance(explicit, str) else None)


def read_conversations(path: Path, bad: BadLines, opts: ReadOptions,
                       parse: Callable[..., Question]) -> Iterator[Question]:
    """A file of recorded conversations, a JSON array or JSONL, each record through `parse`; a repeated id gets
    "~2", "~3" appended."""
    shape, _ = first_record(path)
    records = json_array_records(path) if shape == "array" else jsonl_records(path)
    return read_questions_from(path, records, partial(parse, opts=opts), bad, kind_hint=partial(kind_hint, opts=opts),
                               duplicates="rename")

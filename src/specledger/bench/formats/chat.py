"""OpenAI chat JSONL: {"messages": [{"role", "content"}, ...], "max_tokens"?, "reference" | "answer"?} per line.

The shape of logged production traffic and of fine-tuning sets; an OpenAI batch line ({"custom_id", "body":
{"messages", "max_tokens"}}) is read through its body. A JSON array of such records is accepted too. `content`
may be a string or a list of text parts. User messages become turns; a recorded assistant reply becomes that
turn's reference unless a reference/answer field is given (see conversation.py); `max_tokens` (or
`max_completion_tokens`) caps the answer; `min_tokens` (vLLM's and specledger's extension) asks for at least that
many (with max_tokens: a fixed answer length, as load tests send). Optional `category` / `kind` fields give the
task kind, else --kind, else multi_turn. Ids (`id`, `custom_id`) that repeat get "~2", "~3" appended; without one, L<line>.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specledger.bench.formats.conversation import read_conversations, record_id, to_question, token_limit
from specledger.bench.formats.lines import BadLines
from specledger.records.question import Question, ReadOptions


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}: content part of type {kind!r} is not supported (text only)")
        return "\n".join(parts)
    raise ValueError(f"{where}: content must be a string or a list of text parts")


def parse_record(obj: Any, lineno: int, opts: ReadOptions) -> Question:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    body = obj["body"] if "messages" not in obj and isinstance(obj.get("body"), dict) else obj
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise ValueError("field 'messages': missing or not a list")
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"field 'messages.{i}': expected {{\"role\": str, \"content\": ...}}")
        messages.append((m["role"], _content(m.get("content"), f"field 'messages.{i}'")))
    most, least = token_limit(body), token_limit(body, ("min_tokens",))
    if most is not None and least is not None and least > most:  # (was clamped to max_tokens without a word)
        raise ValueError(f"field 'min_tokens': {least} is above max_tokens {most}")
    return to_question(record_id(obj, lineno, "id", "custom_id", "question_id"), messages,
                       category=obj.get("category"), explicit_kind=obj.get("kind"), opts=opts,
                       default_category="chat", record=obj, max_tokens=most, min_tokens=least)


def read(path: Path, bad: BadLines, opts: ReadOptions) -> Iterator[Question]:
    return read_conversations(path, bad, opts, parse_record)

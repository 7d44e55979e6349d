"""ShareGPT: {"id", "conversations": [{"from": "human" | "gpt" | "system", "value": "..."}, ...]} per record.

The file is a JSON array (as published, and as `vllm bench serve` and SGLang's bench_serving read it; streamed,
never loaded whole) or JSONL. Human turns become turns; the recorded gpt turns become their references (see
conversation.py). Optional `category` / `kind` fields give the task kind, else --kind, else multi_turn. Ids repeat
in some dumps: a repeated id gets "~2", "~3" appended.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specledger.bench.formats.conversation import read_conversations, record_id, to_question
from specledger.bench.formats.lines import BadLines
from specledger.records.question import Question, ReadOptions


def parse_record(obj: Any, lineno: int, opts: ReadOptions) -> Question:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    conv = obj.get("conversations")
    if not isinstance(conv, list):
        raise ValueError("field 'conversations': missing or not a list")
    messages = []
    for i, m in enumerate(conv):
        if not isinstance(m, dict) or not isinstance(m.get("from"), str) or not isinstance(m.get("value"), str):
            raise ValueError(f"field 'conversations.{i}': expected {{\"from\": str, \"value\": str}}")
        messages.append((m["from"], m["value"]))
    return to_question(record_id(obj, lineno, "id", "question_id"), messages, category=obj.get("category"),
                       explicit_kind=obj.get("kind"), opts=opts, default_category="sharegpt",
                       record=obj)


def read(path: Path, bad: BadLines, opts: ReadOptions) -> Iterator[Question]:
    return read_conversations(path, bad, opts, parse_record)

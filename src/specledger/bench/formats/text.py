"""Plain text: one single-turn prompt per non-blank line (task kind: --kind, else multi_turn)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from specledger.bench.formats.lines import BadLines, read_questions_from, text_lines
from specledger.records.question import Question, ReadOptions


def read(path: Path, bad: BadLines, opts: ReadOptions) -> Iterator[Question]:
    def parse(line: str, lineno: int) -> Question:
        return Question(question_id=f"L{lineno}", category="text", kind=opts.kind_for(), turns=(line,))

    return read_questions_from(path, text_lines(path), parse, bad, kind_hint=lambda _: opts.kind_for())

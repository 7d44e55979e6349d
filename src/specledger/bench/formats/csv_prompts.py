"""CSV (or .tsv) prompt lists: one single-turn question per row, the prompt in a named column.

The prompt column is --prompt-column, else the first header among PROMPT_COLUMNS (case-insensitive), else the
only column. Optional columns: a reference (REFERENCE_COLUMNS; "a|b" = acceptable answers), `category`, `kind`,
`id`, `max_tokens`. A row with an empty prompt, more fields than the header or an unbalanced quote (see
lines.csv_rows) is a bad line.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from specledger.bench.formats.lines import BadLines, csv_header, csv_rows, read_questions_from
from specledger.records.question import Question, ReadOptions
from specledger.errors import BadInput

PROMPT_COLUMNS = ("prompt", "question", "input", "instruction", "query", "text", "content", "message")
REFERENCE_COLUMNS = ("reference", "answer", "expected", "ideal", "target", "output", "response")


def _find(header: list[str], names: tuple[str, ...]) -> str | None:
    lower = {h.strip().lower(): h for h in header if h is not None}
    return next((lower[n] for n in names if n in lower), None)


def columns(path: Path, opts: ReadOptions, delimiter: str) -> dict[str, str | None]:
    header = csv_header(path, delimiter)
    if not header:
        raise BadInput(f"{path}: empty CSV (the first line must name the columns)")
    prompt: str | None = opts.prompt_column
    if prompt is not None:
        if prompt not in header:
            raise BadInput(f"{path}: no column {prompt!r} (columns: {', '.join(header)})")
    else:
        prompt = _find(header, PROMPT_COLUMNS) or (header[0] if len(header) == 1 else None)
        if prompt is None:
            raise BadInput(f"{path}: no prompt column among {', '.join(header)}; "
                           "name it with --prompt-column NAME")
    return {"prompt": prompt, "reference": _find(header, REFERENCE_COLUMNS), "category": _find(header, ("category",)),
            "kind": _find(header, ("kind",)), "id": _find(header, ("id", "question_id")),
            "max_tokens": _find(header, ("max_tokens", "max_new_tokens"))}


def _cell(row: Any, cols: dict[str, str | None], name: str) -> str:
    """The stripped text of a row's optional column ("" where the file has no such column)."""
    column = cols[name]
    return (row.get(column) or "").strip() if column and isinstance(row, dict) else ""


def parse_row(row: dict, lineno: int, cols: dict[str, str | None], opts: ReadOptions) -> Question:
    if None in row:
        raise ValueError(f"{len(row) - 1 + len(row[None])} fields, the header names {len(row) - 1}")
    prompt = row.get(cols["prompt"]) or ""
    if not prompt.strip():
        raise ValueError(f"column {cols['prompt']!r}: empty prompt")
    cell = partial(_cell, row, cols)
    limit = None
    if cell("max_tokens"):
        try:
            limit = int(cell("max_tokens"))
        except ValueError:
            limit = 0
        if limit < 1:
            raise ValueError(f"column {cols['max_tokens']!r}: must be a positive integer, got {cell('max_tokens')!r}")
    category = cell("category")
    ref = row.get(cols["reference"]) if cols["reference"] else None
    return Question(
        question_id=cell("id") or f"L{lineno}", category=category or "csv",
        kind=opts.kind_for(category or None, cell("kind") or None), turns=(prompt,),
        reference=(ref,) if ref and ref.strip() else None, max_tokens=limit,
    )


def _hint(row: Any, cols: dict[str, str | None], opts: ReadOptions) -> str:
    return opts.kind_for(_cell(row, cols, "category") or None, _cell(row, cols, "kind") or None)


def read(path: Path, bad: BadLines, opts: ReadOptions) -> Iterator[Question]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    cols = columns(path, opts, delimiter)
    return read_questions_from(path, csv_rows(path, delimiter), partial(parse_row, cols=cols, opts=opts), bad,
                               kind_hint=partial(_hint, cols=cols, opts=opts), duplicates="rename")

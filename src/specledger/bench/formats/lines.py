"""Record sources and the bad-line policy shared by every workload reader.

A source yields (line number, record) one record at a time, so a file of any size streams: JSONL lines, the
elements of a JSON array (parsed incrementally, never the whole file at once), CSV rows (dicts) and text lines.
A record that cannot be decoded comes as `Unreadable(reason)`; the reader's own checks raise ValueError. Either
way `BadLines` decides: `stop` raises one line naming file:line, `skip` counts the line under its task kind
("unreadable" when the line is not even a record) so the run summary and the report can say what was left out.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specledger.errors import BadInput

WARNINGS_SHOWN = 5  # skipped lines printed one by one; the rest are counted
_CHUNK = 1 << 20
_MAX_ELEMENT = 64 << 20  # a JSON array element larger than this is taken for a broken file


@dataclass(frozen=True)
class Unreadable:
    reason: str


Record = tuple[int, Any]


@dataclass
class BadLines:
    """What to do with a line that is not a valid record, and the tally of skipped lines per task kind."""

    policy: str = "stop"
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    quiet: bool = False  # a counting pass (per-category sampling reads the file twice): no warnings

    def __post_init__(self) -> None:
        if self.policy not in ("stop", "skip"):
            raise BadInput(f"on_bad_line must be 'stop' or 'skip', got {self.policy!r}")

    def bad(self, where: str, reason: str, kind: str | None) -> None:
        message = f"{where}: {reason}"
        if self.policy == "stop":
            raise BadInput(f"{message} (--on-bad-line skip skips such lines and counts them)")
        self.skipped[kind or "unreadable"] += 1
        if len(self.examples) < WARNINGS_SHOWN:
            self.examples.append(message)
            if not self.quiet:
                print(f"warning: skipped {message}", file=sys.stderr)

    @property
    def total(self) -> int:
        return sum(self.skipped.values())


def _open(path: Path):
    if not path.is_file():
        raise BadInput(f"workload file not found: {path}")
    return path.open(encoding="utf-8-sig", errors="replace", newline="")  # a BOM is not content


def jsonl_records(path: Path) -> Iterator[Record]:
    """One JSON value per non-blank line."""
    with _open(path) as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                yield lineno, json.loads(text)
            except json.JSONDecodeError as exc:
                yield lineno, Unreadable(f"bad JSON ({exc.msg} at column {exc.colno})")


def json_array_records(path: Path) -> Iterator[Record]:
    """The elements of a top-level JSON array, decoded one at a time; the line number is where each starts.

    A syntax error inside the array leaves no way to find the next element, so it stops the read whatever the
    bad-line policy (the file is not valid JSON).
    """
    decoder = json.JSONDecoder()
    with _open(path) as fh:
        buf, pos, line, eof = "", 0, 1, False

        def fill() -> bool:
            nonlocal buf, pos, eof
            if eof:
                return False
            data = fh.read(_CHUNK)
            eof = not data
            buf, pos = buf[pos:] + data, 0
            return bool(data)

        def skip_space() -> str:
            nonlocal pos, line
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    line += buf[pos] == "\n"
                    pos += 1
                if pos < len(buf) or not fill():
                    return buf[pos] if pos < len(buf) else ""

        if skip_space() != "[":
            raise BadInput(f"{path}:{line}: expected a JSON array ('[' first)")
        pos += 1
        first = True
        while True:
            ch = skip_space()
            if ch == "]":
                return
            if not first:
                if ch != ",":
                    raise BadInput(f"{path}:{line}: not valid JSON (expected ',' or ']' between array elements)")
                pos += 1
                skip_space()
            first = False
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as exc:
                    if len(buf) - pos > _MAX_ELEMENT or not fill():
                        raise BadInput(f"{path}:{line}: not valid JSON ({exc.msg}); a JSON array cannot be read "
                                       "past a syntax error (JSONL can: one record per line)") from None
            yield line, obj
            line += buf.count("\n", pos, end)
            pos = end


def csv_rows(path: Path, delimiter: str = ",") -> Iterator[Record]:
    """CSV rows as dicts keyed by the header; the line number is where the row starts."""
    with _open(path) as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        start = 2
        try:
            for row in reader:
                yield start, row
                start = reader.line_num + 1
        except csv.Error as exc:
            raise BadInput(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None


def csv_header(path: Path, delimiter: str = ",") -> list[str]:
    with _open(path) as fh:
        try:
            return next(csv.reader(fh, delimiter=delimiter), [])
        except csv.Error as exc:
            raise BadInput(f"{path}:1: not valid CSV ({exc})") from None


def text_lines(path: Path) -> Iterator[Record]:
    """Non-blank lines, stripped of the line end."""
    with _open(path) as fh:
        for lineno, text in enumerate(fh, start=1):
            text = text.rstrip("\r\n")
            if text.strip():
                yield lineno, text


def first_record(path: Path) -> tuple[str, Any]:
    """("array", first element) | ("jsonl", first object) | ("text", first line): what detection looks at."""
    with _open(path) as fh:
        head = fh.read(4096)
    stripped = head.lstrip("\ufeff \t\r\n")
    if stripped.startswith("["):
        for _, obj in json_array_records(path):
            return "array", obj
        return "array", None
    if stripped.startswith("{"):
        for _, obj in jsonl_records(path):
            return "jsonl", obj
    return "text", stripped.splitlines()[0] if stripped else ""


def read_questions_from(
    path: Path, records: Iterator[Record], parse, bad: BadLines, *, kind_hint, duplicates: str = "bad"
) -> Iterator[Any]:
    """Parse each record with `parse(record, lineno) -> Question`, routing failures through `bad`.

    duplicates: "bad" (a repeated question_id is a bad line: Spec-Bench) or "rename" (the repeat gets "~2", "~3"
    appended: formats whose ids are incidental, e.g. ShareGPT dumps).
    """
    seen: dict[str, int] = {}
    for lineno, raw in records:
        try:
            if isinstance(raw, Unreadable):
                raise ValueError(raw.reason)
            q = parse(raw, lineno)
            if q.question_id in seen:
                if duplicates == "bad":
                    raise ValueError(f"duplicate question_id {q.question_id!r}")
                seen[q.question_id] += 1
                q = replace(q, question_id=f"{q.question_id}~{seen[q.question_id]}")
        except ValueError as exc:
            bad.bad(f"{path}:{lineno}", str(exc), None if isinstance(raw, Unreadable) else kind_hint(raw))
            continue
        seen.setdefault(q.question_id, 1)
        yield q

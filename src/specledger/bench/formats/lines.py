"""Record sources and the bad-line policy shared by every workload reader.

A source yields (line number, record) one record at a time, so a file of any size streams: JSONL lines, the
elements of a JSON array (parsed incrementally, never the whole file at once), CSV rows (dicts) and text lines.
A record that cannot be decoded comes as `Unreadable(reason)`; the reader's own checks raise ValueError. Either
way `BadLines` decides: `stop` raises one line naming file:line, `skip` counts the line under its task kind
("unreadable" when the line is not even a record) so the run summary and the report can say what was left out.
"""

from __future__ import annotations

import csv
import re
import gzip
import json
import sys
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TypeVar

from pydantic import BaseModel, ValidationError

from specledger import errors
from specledger.errors import BadInput

WARNINGS_SHOWN = 5  # skipped lines printed one by one; the rest are counted
_CHUNK = 1 << 20
_MAX_ELEMENT = 64 << 20  # a JSON array element larger than this is taken for a broken file
# a record (line, array element) longer than this is a bad line, refused before anything tokenizes it: ~2M tokens of
# English, past any context; a 50 MB line used to be tokenized whole (145 s, 8.9 GB) before the context refused it
MAX_RECORD_CHARS = 8 << 20
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], obj: Any, describe: Callable[[ValidationError], str] = errors.describe) -> M:
    """A record as its pydantic model, else ValueError naming the first problem (readers route it to BadLines)."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(describe(exc)) from None


def _open(path: Path):
    if not path.is_file():
        raise BadInput(f"workload file not found: {path}")
    if path.suffix.lower() == ".gz":  # (HumanEval ships its JSONL gzipped)
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="replace", newline="")
    return path.open(encoding="utf-8-sig", errors="replace", newline="")  # a BOM is not content


def _bounded_lines(fh: Any) -> Iterator[tuple[int, str | int]]:
    """(line number, text), or (line number, its length) for a line longer than MAX_RECORD_CHARS: never held whole."""
    lineno = 0
    while text := fh.readline(MAX_RECORD_CHARS + 1):
        lineno += 1
        if len(text) <= MAX_RECORD_CHARS or text.endswith("\n"):
            yield lineno, text
            continue
        n = len(text)
        while (more := fh.readline(_CHUNK)) and not more.endswith("\n"):
            n += len(more)
        yield lineno, n + len(more)


def _too_long(n: int) -> Unreadable:
    return Unreadable(f"{n:,} characters, longer than the {MAX_RECORD_CHARS:,} a record may hold (no context fits it)")


def _lone_surrogate(obj: Any) -> str | None:
    """The path of the first string (key or value) holding a lone surrogate ("\\ud800" in the JSON): text no encoder
    can write, so a request carrying it would fail at the first write."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"invalid text: a lone surrogate {obj[exc.start]!r} at character {exc.start}"
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        found = _lone_surrogate(k) if isinstance(k, str) else None
        found = found or _lone_surrogate(v)
        if found:
            return f"{k}: {found}" if found.startswith("invalid") else f"{k}.{found}"
    return None


def _decoded(text: str, obj: Any) -> Any:
    """The record, or Unreadable where its text holds a lone surrogate (only a \\uD800-\\uDFFF escape can make one:
    the file is read with undecodable bytes replaced)."""
    if _SURROGATE_ESCAPE.search(text) and (where := _lone_surrogate(obj)):
        return Unreadable(where if where.startswith("invalid") else f"field {where}")
    return obj


def jsonl_records(path: Path) -> Iterator[Record]:
    """One JSON value per non-blank line."""
    with _open(path) as fh:
        for lineno, text in _bounded_lines(fh):
            if isinstance(text, int):
                yield lineno, _too_long(text)
                continue
            if not text.strip():
                continue
            try:
                yield lineno, _decoded(text, json.loads(text))
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
            text = buf[pos:end]
            yield line, _too_long(len(text)) if len(text) > MAX_RECORD_CHARS else _decoded(text, obj)
            line += buf.count("\n", pos, end)
            pos = end


class _Lines:
    """Physical lines with their numbers for the csv module, keeping those of the row being read so that the
    reading can start again on the line after a bad row's first."""

    def __init__(self, fh: Any):
        self._fh, self._back, self._next = fh, deque[tuple[int, str]](), 1
        self.taken: list[tuple[int, str]] = []

    def __iter__(self) -> "_Lines":
        return self

    def __next__(self) -> str:
        if self._back:
            item = self._back.popleft()
        else:
            item = (self._next, next(self._fh))
            self._next += 1
        self.taken.append(item)
        return item[1]

    def again(self, lines: list[tuple[int, str]]) -> None:
        self._back.extendleft(reversed(lines))


def csv_rows(path: Path, delimiter: str = ",") -> Iterator[Record]:
    """CSV rows as dicts keyed by the header (extra fields under None, as csv.DictReader); the line number is
    where the row starts.

    A quoted field may hold line breaks, so an unclosed quote would swallow the rows after it up to the next
    quote character. Read strictly, a quote that closes such a field is not followed by a delimiter or a line
    end (or the file ends inside it): the row is then a bad line at its first line, and reading starts again on
    the next line, so the rows it swallowed are read as their own.
    """
    with _open(path) as fh:
        lines = _Lines(fh)
        header: list[str] | None = None
        while True:
            lines.taken.clear()
            try:
                fields = next(csv.reader(lines, delimiter=delimiter, strict=True))
            except StopIteration:
                return
            except csv.Error as exc:
                start = lines.taken[0][0] if lines.taken else 1
                if header is None:
                    raise BadInput(f"{path}:{start}: not valid CSV ({exc})") from None
                yield start, Unreadable(f"unbalanced quote: a quoted field opened on this line does not close before "
                                        f"a delimiter or line end ({exc}); read on from the next line")
                lines.again(lines.taken[1:])
                continue
            if header is None:
                header = fields
            elif swallowed := _swallowed_rows(lines.taken, len(header), delimiter):
                yield lines.taken[0][0], Unreadable(swallowed)
                lines.again(lines.taken[1:])
            elif fields:
                row: dict[Any, Any] = dict(zip(header, fields))
                row.update({h: None for h in header[len(fields):]})
                if len(fields) > len(header):
                    row[None] = fields[len(header):]
                yield lines.taken[0][0], row


def _swallowed_rows(taken: list[tuple[int, str]], width: int, delimiter: str) -> str | None:
    """A row over several lines each of which, its quotes taken as plain text, is a whole row of the header's width:
    a stray quote that closed right before a delimiter swallowed the rows between (read strictly it is valid CSV).
    A field that truly spans lines has a line with another count of delimiters."""
    if len(taken) < 2 or any(len(next(csv.reader([text], delimiter=delimiter, quoting=csv.QUOTE_NONE), [])) != width
                             for _, text in taken):
        return None
    return (f"a quoted field runs over lines {taken[0][0]}-{taken[-1][0]}, and each of those {len(taken)} lines is a "
            f"whole row of {width} fields on its own: a stray quote swallowing rows? read on from the next line")


def csv_header(path: Path, delimiter: str = ",") -> list[str]:
    with _open(path) as fh:
        try:
            return next(csv.reader(fh, delimiter=delimiter), [])
        except csv.Error as exc:
            raise BadInput(f"{path}:1: not valid CSV ({exc})") from None


def text_lines(path: Path) -> Iterator[Record]:
    """Non-blank lines, stripped of the line end."""
    with _open(path) as fh:
        for lineno, text in _bounded_lines(fh):
            if isinstance(text, int):
                yield lineno, _too_long(text)
                continue
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

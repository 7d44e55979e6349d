"""Which reader a workload path gets: named (`FORMAT:PATH`) or detected from the file's first record.

Detection looks at the extension (.csv / .tsv -> csv, .txt -> text), then at the first record: a JSON array or
JSONL whose first object has `turns` (Spec-Bench), `conversations` (ShareGPT), `messages` or `body.messages`
(OpenAI chat / batch), `timestamp` + `input_length` (a trace), `prompt` + `test` + `entry_point` (code tasks);
a first line that is not JSON -> text.
The choice and its reason are returned so the run can say which was chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specledger.bench.formats.lines import BadLines, Unreadable, first_record
from specledger.records.question import Question, ReadOptions
from specledger.errors import BadInput

FORMATS = ("spec-bench", "sharegpt", "chat", "csv", "text", "trace", "code")
_ALIASES = {"specbench": "spec-bench", "openai": "chat", "tsv": "csv", "txt": "text", "mooncake": "trace"}
_HINT = "name it as FORMAT:PATH with FORMAT one of " + ", ".join(FORMATS)

Reader = Callable[[Path, BadLines, ReadOptions], Iterator[Question]]


def reader(fmt: str) -> Reader:
    from specledger.bench.formats import (
        chat,
        code,
        csv_prompts,
        sharegpt,
        spec_bench,
        text,
        trace,
    )

    return {"spec-bench": spec_bench.read, "sharegpt": sharegpt.read, "chat": chat.read, "csv": csv_prompts.read,
            "text": text.read, "trace": trace.read, "code": code.read}[fmt]


def _by_keys(obj: Any) -> tuple[str, str] | None:
    if not isinstance(obj, dict):
        return None
    body = obj.get("body")
    for key, fmt in (("turns", "spec-bench"), ("conversations", "sharegpt"), ("messages", "chat")):
        if key in obj:
            return fmt, f"the first record's '{key}' field"
    if isinstance(body, dict) and "messages" in body:
        return "chat", "the first record's 'body.messages' (OpenAI batch request)"
    if "timestamp" in obj and "input_length" in obj:
        return "trace", "the first record's 'timestamp' and 'input_length' fields"
    if {"prompt", "test", "entry_point"} <= obj.keys():
        return "code", "the first record's 'prompt', 'test' and 'entry_point' fields (HumanEval's shape)"
    return None


def detect(path: Path) -> tuple[str, str]:
    """(format, why) for a workload file."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return "csv", f"the {suffix} extension"
    if suffix == ".txt":
        return "text", "the .txt extension"
    shape, obj = first_record(path)
    if shape == "text":
        return "text", "a first line that is not JSON"
    if isinstance(obj, Unreadable):
        raise BadInput(f"{path}: the first line is not valid JSON ({obj.reason}); {_HINT}")
    found = _by_keys(obj)
    if found is None:
        keys = ", ".join(sorted(obj)) if isinstance(obj, dict) else type(obj).__name__
        raise BadInput(f"{path}: cannot tell the workload format from the first record ({keys}); {_HINT}")
    fmt, why = found
    if shape == "array" and fmt == "trace":
        raise BadInput(f"{path}: a trace is read as JSONL (one request per line), not a JSON array")
    return fmt, why


def resolve(spec: str) -> tuple[str, Path, str]:
    """(format, path, how it was chosen) for "FORMAT:PATH" or a bare PATH."""
    prefix, sep, rest = spec.partition(":")
    name = _ALIASES.get(prefix.strip().lower(), prefix.strip().lower())
    if sep and name in FORMATS:
        if not rest.strip():
            raise BadInput(f"workload {spec!r}: give the file after the colon ({name}:PATH)")
        path = Path(rest).expanduser()
        if not path.is_file():
            raise BadInput(f"workload file not found: {path}")
        return name, path, "named"
    path = Path(spec).expanduser()
    if sep and not path.is_file() and len(prefix) > 1 and prefix.replace("-", "").isalnum():  # not a drive letter
        raise BadInput(f"workload {spec!r}: unknown format {prefix!r} (known: {', '.join(FORMATS)}; or give the PATH "
                       "alone and the format is detected)")
    if not path.is_file():
        known = ", ".join(("builtin", "builtin-quick", "synthetic:in=..,out=..,n=..", "humaneval", "FORMAT:PATH", "PATH"))
        raise BadInput(f"workload file not found: {path} (a workload is one of {known})")
    fmt, why = detect(path)
    return fmt, path, f"detected from {why}"

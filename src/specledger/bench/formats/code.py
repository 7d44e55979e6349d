"""Code tasks, HumanEval's JSONL shape: {"task_id", "prompt", "test", "entry_point"} per line (.jsonl or .jsonl.gz).

`prompt` is the code a solution continues (imports, the signature, the docstring); `test` defines
`check(candidate)`; `entry_point` names the function passed to it. Optional: `instruction` (the chat turn sent
instead of the default one below), `response_prefix` (the start of the answer, given: the model continues it),
`max_tokens`, `category` (default "code"). `canonical_solution` and other fields are ignored. Every record is kind
"code", graded by running its tests (quality/execute.py).

The default turn and answer start are EvalPlus's chat form, the protocol of the Qwen2.5-Coder report's instruct
figures: the user asks for a self-contained script in a markdown block, and the assistant's answer is begun for it
up to the opening of a Python block, so the answer is the code, ended where the block closes. A record with its own
`instruction` gets no start unless it gives one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from specledger.bench.formats.lines import BadLines, jsonl_records, read_questions_from, validated
from specledger.records.question import CodeTask, Question, ReadOptions

INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown code "
               "block:\n```\n{prompt}\n```\n")
# A start that leaves a code block open ends where the block closes (EvalPlus stops there too): what follows it
# is prose and example runs, tokens that cost time and are never graded. It also ends where the script's own
# top-level demo begins (an assert, a print, a main guard at the start of a line): grading runs only the
# definitions (quality/execute.py), so the demo is never graded either. On S26's recorded answers of the Qwen pair
# (1.5B at bf16 and W4A16, 0.5B at W8A16, 164 each) cutting them there changed no grade and left ~81% of the
# tokens (BENCHMARKS.md). Four strings in all: OpenAI's API takes at most four.
CLOSE = "\n```"
DEMO = ("\nassert ", "\nprint(", "\nif __name__")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the problem and passes "
                   "corresponding tests:\n```python\n")


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")
    task_id: StrictStr | StrictInt
    prompt: StrictStr = Field(min_length=1)
    test: StrictStr = Field(min_length=1)
    entry_point: StrictStr = Field(pattern=r"^[A-Za-z_]\w*$")
    instruction: StrictStr | None = None
    response_prefix: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    category: StrictStr | None = None


def parse_record(obj: Any, lineno: int = 0) -> Question:
    """Raises ValueError with a short reason when the record is not a code task."""
    rec = validated(_Record, obj)
    if "def check" not in rec.test:
        raise ValueError("field 'test': defines no check(candidate)")
    text = rec.instruction or INSTRUCTION.format(prompt=rec.prompt.strip())
    start = rec.response_prefix if rec.response_prefix is not None else None if rec.instruction else RESPONSE_PREFIX
    return Question(question_id=str(rec.task_id), category=rec.category or "code", kind="code", turns=(text,),
                    max_tokens=rec.max_tokens, code=CodeTask(rec.prompt, rec.test, rec.entry_point),
                    prefill=start or None, stop=(CLOSE, *DEMO) if start and start.count("```") % 2 else ())


def read(path: Path, bad: BadLines, opts: ReadOptions | None = None) -> Iterator[Question]:
    """Stream a code-task JSONL file (gzipped or not); a duplicate task_id is a bad line."""
    return read_questions_from(path, jsonl_records(path), parse_record, bad, kind_hint=lambda obj: "code")

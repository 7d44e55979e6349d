"""Timed request traces (Mooncake-style JSONL): {"timestamp": ms, "input_length", "output_length", "hash_ids"?}.

Each line is one single-turn request arriving `timestamp` milliseconds into the trace (`arrival_s`, replayed by
the `replay` load kind at its own spacing, scaled by a speed factor), answering exactly `output_length` tokens
(min = max). The prompt is the line's `prompt` when it has one, else synthetic filler of `input_length` tokens
(the synthetic workload's estimate), trimmed when sent by the tokens the backend's chat template adds, so that
the whole prompt is `input_length` tokens (synthetic.fit_prompt; a run notes where the template is not known). With `hash_ids` the filler is built in
blocks of BLOCK_TOKENS, block j seeded by hash_ids[j] (a partial last block is the start of the full one), so
requests that share hash ids share a prompt prefix, as in the trace (Mooncake hashes 512-token blocks). Task kind: --kind, else summarization (the filler asks for a
summary); traces carry no references.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from specledger.bench.formats.lines import BadLines, jsonl_records, read_questions_from
from specledger.records.question import Question, ReadOptions
from specledger.bench.synthetic import synthetic_prompt, truncate_tokens

BLOCK_TOKENS = 512


def _count(obj: dict, name: str, minimum: int) -> int:
    value = obj.get(name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"field '{name}': must be an integer >= {minimum}, got {value!r}")
    return value


def prompt_of(input_length: int, hash_ids: list[int] | None, lineno: int) -> str:
    if not hash_ids:
        return synthetic_prompt(input_length, f"trace/{lineno}")  # type: ignore[arg-type]
    blocks = []
    for j, start in enumerate(range(0, input_length, BLOCK_TOKENS)):
        seed = f"hash/{hash_ids[j]}" if j < len(hash_ids) else f"trace/{lineno}/{j}"
        size = min(BLOCK_TOKENS, input_length - start)
        full = synthetic_prompt(BLOCK_TOKENS, seed, instruction=j == 0)  # type: ignore[arg-type]
        blocks.append(truncate_tokens(full, size))
    return " ".join(blocks)


def parse_record(obj: Any, lineno: int, opts: ReadOptions) -> Question:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
        raise ValueError(f"field 'timestamp': must be a number of milliseconds >= 0, got {ts!r}")
    n_in, n_out = _count(obj, "input_length", 1), _count(obj, "output_length", 1)
    hash_ids = obj.get("hash_ids")
    if hash_ids is not None and (not isinstance(hash_ids, list)
                                 or not all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids)):
        raise ValueError("field 'hash_ids': must be a list of integers")
    prompt = obj.get("prompt")
    if prompt is not None and not (isinstance(prompt, str) and prompt.strip()):
        raise ValueError("field 'prompt': must be a non-empty string")
    qid = obj.get("request_id", obj.get("id"))
    return Question(
        question_id=str(qid) if isinstance(qid, (str, int)) and str(qid).strip() else f"L{lineno}",
        category="trace", kind=opts.kind or "summarization",
        turns=(prompt or prompt_of(n_in, hash_ids, lineno),),
        max_tokens=n_out, min_tokens=n_out, arrival_s=ts / 1000.0,
        prompt_tokens=None if prompt else n_in,
    )


def read(path: Path, bad: BadLines, opts: ReadOptions) -> Iterator[Question]:
    return read_questions_from(path, jsonl_records(path), partial(parse_record, opts=opts), bad,
                               kind_hint=lambda _: opts.kind or "summarization", duplicates="rename")

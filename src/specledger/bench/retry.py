"""The measured retry loop (records/config.py RetrySettings): a graded answer that fails is asked again, for real.

Attempt 1 is the level's own request. Attempts 2..N go to the same backend with the policy's sampling
(temperature T, top-p, a seed per item and attempt) and, with `feedback`, the failed answer and the grader's
message (a code task's failing test line) as the next turns; the loop stops at the first pass. Each attempt's
service seconds (end - start: the device busy on it, queueing excluded), tokens and grade are kept on the item's
record (RequestRecord.attempts); ledger/attempts.py prices them.
"""

from __future__ import annotations

import asyncio

from specledger.bench.backends.base import Backend, Completion
from specledger.quality.graders import GradeResult, grade
from specledger.records.config import RetrySettings, Sampling
from specledger.records.question import Question
from specledger.records.results import Attempt

FEEDBACK = ("That answer did not pass the tests: {message}\nPlease fix it and give the whole corrected solution "
            "in one markdown code block.")


async def grade_answer(q: Question, answers: list[str], grader: str | None) -> GradeResult:
    """grade(), off the event loop where it runs code (seconds per answer): other requests keep flowing."""
    if q.code is not None and not grader:
        return await asyncio.to_thread(grade, q, answers, grader)
    return grade(q, answers, grader)


def attempt(k: int, c: Completion, g: GradeResult | None, sampling: Sampling) -> Attempt:
    return Attempt(k=k, passed=g.passed if g is not None else False,
                   outcome=(g.outcome or ("passed" if g.passed else "failed")) if g is not None else "request failed",
                   detail=g.detail[:300] if g is not None else (c.error or "")[:300],
                   device_s=max(0.0, c.end - c.start), prompt_tokens=c.prompt_tokens or 0,
                   output_tokens=c.output_tokens if c.ok else 0, temperature=sampling.temperature, seed=sampling.seed)


def answer_sampling(base: Sampling, q: Question) -> Sampling:
    """The sampling of the last turn's answer: the configuration's, with the question's own stop strings added."""
    return base.model_copy(update={"stop": [*base.stop, *q.stop]}) if q.stop else base


def retry_sampling(base: Sampling, policy: RetrySettings, item: int, k: int) -> Sampling:
    return base.model_copy(update={"temperature": policy.temperature, "top_p": policy.top_p,
                                   "seed": policy.seed + 1000 * max(item, 0) + k})


def feedback_turns(q: Question, messages: list[dict[str, str]], failed: str,
                   grade: GradeResult) -> list[dict[str, str]]:
    """`messages` followed by the failed answer and the grader's message asking for a fix (`feedback`)."""
    return [*messages, {"role": "assistant", "content": q.answer(failed)},
            {"role": "user", "content": FEEDBACK.format(message=grade.detail or grade.outcome or "failed")}]


async def retries(backend: Backend, base: Sampling, policy: RetrySettings, q: Question, *,
                  messages: list[dict[str, str]], answers: list[str], first: Completion, first_grade: GradeResult,
                  item: int, max_tokens: int, grader: str | None) -> list[Attempt]:
    """Every attempt at the item's last turn, the first included; `messages` end in that turn's user message."""
    out = [attempt(1, first, first_grade, base)]
    last_text, last_grade = first.text, first_grade
    for k in range(2, policy.attempts + 1):
        if out[-1].passed:
            break
        sampling = retry_sampling(answer_sampling(base, q), policy, item, k)
        sent = feedback_turns(q, messages, last_text, last_grade) if policy.feedback else list(messages)
        c = await backend.complete(q.sent(sent), max_tokens=max_tokens, sampling=sampling)
        g = await grade_answer(q, answers + [q.answer(c.text)], grader) if c.ok else None
        out.append(attempt(k, c, g, sampling))
        if c.ok and g is not None:
            last_text, last_grade = c.text, g
    return out

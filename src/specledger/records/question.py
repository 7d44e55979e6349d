"""The question record every workload reader produces, and its task kind.

Every question carries one of seven task kinds (KINDS) so graders and per-kind reports need not guess from
free-form category names. Category -> kind:

- MT-Bench categories (writing, roleplay, reasoning, math, coding, extraction, stem, humanities) -> multi_turn.
  Note that MT-Bench's "math" is a two-turn chat (kind multi_turn); grade-school word problems are
  "math_reasoning" (kind math), as in Spec-Bench.
- translation, summarization, qa, math_reasoning, rag (Spec-Bench's names) and a few common aliases
  (_ALIASES) -> their kind.
- A record's own "kind" field, when it names one of KINDS, overrides the mapping; formats without categories
  take the kind given to the reader (--kind), else multi_turn.
- code (HumanEval's shape: prompt, test, entry_point; bench/formats/code.py) -> code, graded by running the
  task's tests against the answer's code (quality/execute.py).
- Any other category -> multi_turn: an open-ended chat question, graded only by explicit rules.

`reference` entries align with turns (Spec-Bench's convention): a string, or a tuple of acceptable answers;
see quality/graders.py for how they are read.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("multi_turn", "translation", "summarization", "qa", "math", "rag", "code")

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")

_ALIASES = {
    "translation": "translation",
    "translate": "translation",
    "wmt": "translation",
    "summarization": "summarization",
    "summarisation": "summarization",
    "summary": "summarization",
    "cnn_dm": "summarization",
    "qa": "qa",
    "question_answering": "qa",
    "natural_questions": "qa",
    "math_reasoning": "math",
    "gsm8k": "math",
    "rag": "rag",
    "retrieval": "rag",
    "code": "code",
    "humaneval": "code",
}

# One entry per turn: "" (none), a string (rules and "|"-separated alternatives allowed), or a tuple of
# acceptable answers taken literally (Spec-Bench's RAG lines).
Reference = tuple[str | tuple[str, ...], ...]


@dataclass(frozen=True)
class CodeTask:
    """A code task graded by running its tests (quality/execute.py): the prompt a completion continues (a
    signature and docstring), the test code defining check(candidate), and the function it checks."""

    prompt: str
    tests: str
    entry_point: str


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    kind: str
    turns: tuple[str, ...]
    reference: Reference | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    system: str | None = None  # a system message sent before the first turn (chat and ShareGPT records)
    arrival_s: float | None = None  # timed traces: seconds after the trace's first request
    # the whole prompt's tokens the workload asks for, chat template included (a trace's input_length): the
    # filler turn is trimmed by the tokens the backend's template adds (synthetic.fit_prompt)
    prompt_tokens: int | None = None
    code: CodeTask | None = None  # kind "code": graded by running code.tests against the answer's code
    # the start of the last turn's answer, given: sent as a trailing assistant message, which the model continues
    # (a prefill, as evalplus's response prefix); the answer graded is this text and the model's continuation
    prefill: str | None = None
    stop: tuple[str, ...] = ()  # where the last turn's answer ends, besides the configuration's own stop strings

    def answer(self, text: str) -> str:
        """The last turn's whole answer: the prefill (when given) and what the model wrote after it."""
        return (self.prefill or "") + text

    def sent(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """The messages sent for the last turn: those given, and the prefill as the assistant's first words."""
        return [*messages, {"role": "assistant", "content": self.prefill}] if self.prefill else list(messages)


@dataclass(frozen=True)
class ReadOptions:
    """What a reader cannot learn from a record: the task kind of records without one, the CSV prompt column."""

    kind: str | None = None
    prompt_column: str | None = None

    def kind_for(self, category: str | None = None, explicit: str | None = None) -> str:
        if explicit in KINDS:
            return explicit
        return kind_of(category, self.kind) if category else self.kind or "multi_turn"


def kind_of(category: str, explicit: str | None = None) -> str:
    """The task kind of a category (see the module docstring for the mapping)."""
    if explicit in KINDS:
        return explicit
    name = category.strip().lower()
    if name in MT_BENCH_CATEGORIES:
        return "multi_turn"
    return _ALIASES.get(name, "multi_turn")

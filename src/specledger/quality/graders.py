"""Graders: did an answer pass its task? One default grader per task kind, explicit rules, user graders.

Which grader applies to a question:
1. `user_grader` ("module:function" or "path/to/file.py:function", optionally suffixed ">=0.7"), when given.
2. Rules, for reference entries written as one: "contains:A|B" (the normalised answer contains A or B as
   whole words), "number:X" (the answer's final number equals X), "word:A|B" (the answer's first word is A
   or B, any case) or "caps:A" (the first word is exactly A, capitals included). The built-in multi-turn questions use
   them; any workload file may.
3. Other entries by kind, comparing answers[i] with reference[i] (references align with turns; "" = none):
   math -> final-number match; summarization -> ROUGE-L F >= ROUGE_L_MIN; translation -> chrF >= CHRF_MIN;
   qa / rag -> the normalised reference (alternatives separated by "|") is contained in the answer.
   multi_turn without rules -> no grader (MT-Bench references are long model answers, not checkable).
A turn's entry may also be a tuple of acceptable answers (Spec-Bench's RAG lines give a list per turn): the turn
passes when any of them passes as above, and scores the best of them.
A question passes when every graded turn passes; the score (0..1; chrF / 100) is the mean over graded turns.
`grading_rules` says the same per kind, for run summaries and reports.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specledger.records.question import Question
from specledger.errors import BadInput, SpecLedgerError

ROUGE_L_MIN = 0.3
CHRF_MIN = 40.0
CHRF_ORDER = 6
CHRF_BETA = 2.0


@dataclass
class GradeResult:
    passed: bool | None
    score: float | None
    grader: str
    detail: str = ""
    outcome: str | None = None  # code tasks: passed, failed, error or timeout (quality/execute.py)


# --- text measures ---------------------------------------------------------------------------------------

_NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212])?\$?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+)(?![\d.]))?"
)
_FINAL_MARKERS = (
    re.compile(r"\\boxed\{\s*([^{}]*)\}"),
    re.compile(r"####\s*([^\n]*)"),
    re.compile(r"answer\s*(?:is|:|=)\s*([^\n]*)", re.IGNORECASE),
)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")


def _numbers(text: str) -> list[float]:
    out = []
    for m in _NUMBER_RE.finditer(text):
        value = float(m["num"].replace(",", ""))
        if m["den"] and int(m["den"]) != 0:
            value /= int(m["den"])
        out.append(-value if m["sign"] else value)
    return out


def final_number(text: str) -> float | None:
    """The number an answer ends on: the last one in the sentence after the last "answer is"/"####"/\\boxed{}
    that holds a number, else the last one in the text.

    Handles thousands separators (1,234), signs (-5, unicode minus), decimals (.5, 3.75), "$" and a/b fractions.
    """
    for marker in _FINAL_MARKERS:
        for hit in reversed([m.group(1) for m in marker.finditer(text)]):
            nums = _numbers(_SENTENCE_END.split(hit, maxsplit=1)[0])
            if nums:
                return nums[-1]
    nums = _numbers(text)
    return nums[-1] if nums else None


def numbers_match(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation + "\u2018\u2019\u201c\u201d\u2013\u2014"})


def normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD-style answer normalisation)."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def contains_any(answer: str, alternatives: list[str]) -> str | None:
    """The first alternative whose normalised form occurs in the normalised answer as whole words."""
    padded = f" {normalize(answer)} "
    for alt in alternatives:
        norm = normalize(alt)
        if norm and f" {norm} " in padded:
            return alt
    return None


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _lcs_length(a: list[str], b: list[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over lower-cased alphanumeric words (no stemming)."""
    cand, ref = _words(candidate), _words(reference)
    if not cand or not ref:
        return 0.0
    lcs = _lcs_length(cand, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(cand), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def _char_ngrams(text: str, n: int) -> Counter:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf(candidate: str, reference: str, order: int = CHRF_ORDER, beta: float = CHRF_BETA) -> float:
    """chrF (Popovic 2015) in 0..100: character n-gram precision and recall, whitespace removed, each averaged
    over n = 1..order (orders the reference is too short for are left out), combined as F-beta."""
    cand, ref = "".join(candidate.split()), "".join(reference.split())
    precisions, recalls = [], []
    for n in range(1, order + 1):
        c, r = _char_ngrams(cand, n), _char_ngrams(ref, n)
        if not r:
            break
        matched = sum((c & r).values())
        precisions.append(matched / sum(c.values()) if c else 0.0)
        recalls.append(matched / sum(r.values()))
    if not precisions:
        return 0.0
    prec, rec = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    if prec == 0 and rec == 0:
        return 0.0
    b2 = beta * beta
    return 100 * (1 + b2) * prec * rec / (b2 * prec + rec)


# --- per-turn checks --------------------------------------------------------------------------------------

_RULE_RE = re.compile(r"^(contains|number|word|caps):(.*)$", re.DOTALL)
_FIRST_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)


def first_word(answer: str) -> str | None:
    """The answer's first word, punctuation and markup around it dropped."""
    m = _FIRST_WORD_RE.search(answer)
    return m.group(0) if m else None


def _is_rule(ref: str) -> bool:
    return bool(_RULE_RE.match(ref))


def _check_rule(rule: str, answer: str) -> tuple[bool | None, float | None, str]:
    m = _RULE_RE.match(rule)
    assert m is not None, rule  # callers check _is_rule first
    name, arg = m.groups()
    if name == "contains":
        return _contains(answer, [a.strip() for a in arg.split("|")], f"missing {arg!r}")
    if name in ("word", "caps"):  # the first word is one of the alternatives (caps: exactly, case included)
        alternatives = [a.strip() for a in arg.split("|")]
        got = first_word(answer)
        ok = got is not None and (got in alternatives if name == "caps"
                                  else got.lower() in {a.lower() for a in alternatives})
        return ok, float(ok), f"first word {got!r} vs {arg!r}"
    return _final_numbers(arg, answer, f"rule {rule!r}")


def _contains(answer: str, alternatives: list[str], missing: str) -> tuple[bool, float, str]:
    hit = contains_any(answer, alternatives)
    return hit is not None, float(hit is not None), f"contains {hit!r}" if hit else missing


def _final_numbers(reference: str, answer: str, what: str) -> tuple[bool | None, float | None, str]:
    """The answer's final number against the reference's; a reference without one leaves the turn ungraded."""
    want = final_number(reference)
    if want is None:
        return None, None, f"{what} holds no number"
    got = final_number(answer)
    ok = got is not None and numbers_match(got, want)
    return ok, float(ok), f"final number {got} vs {want:g}"


def _check_kind(kind: str, reference: str, answer: str) -> tuple[bool | None, float | None, str]:
    if kind == "math":
        return _final_numbers(reference, answer, f"reference {reference[:40]!r}")
    if kind == "summarization":
        score = rouge_l(answer, reference)
        return score >= ROUGE_L_MIN, score, f"rouge-l {score:.3f}"
    if kind == "translation":
        score = chrf(answer, reference)
        return score >= CHRF_MIN, score / 100, f"chrf {score:.1f}"
    alternatives = [a.strip() for a in reference.split("|")]
    ok, score, detail = _contains(answer, alternatives, "reference not found")
    return ok, score, "exact match" if any(normalize(answer) == normalize(a) for a in alternatives) else detail


def _alternatives(entry: str | tuple[str, ...]) -> list[str]:
    return [entry] if isinstance(entry, str) else [a for a in entry if a.strip()]


def _entry_is_rule(entry: str | tuple[str, ...]) -> bool:
    alts = _alternatives(entry)
    return bool(alts) and all(_is_rule(a) for a in alts)


def _check_entry(kind: str, entry: str | tuple[str, ...], answer: str) -> tuple[bool | None, float | None, str]:
    """One turn against its reference entry: a string, or acceptable answers of which any may match."""
    alts = _alternatives(entry)
    if len(alts) > 1 and kind in ("qa", "rag") and not any(_is_rule(a) for a in alts):
        return _contains(answer, alts, f"none of {len(alts)} acceptable answers found")
    results = [_check_rule(a, answer) if _is_rule(a) else _check_kind(kind, a, answer) for a in alts]
    graded = [r for r in results if r[0] is not None]
    if not graded:
        return results[0]
    best = max(graded, key=lambda r: (bool(r[0]), r[1] or 0.0))
    if len(alts) == 1:
        return best
    return best[0], best[1], f"{best[2]} (best of {len(alts)} acceptable answers)"


_KIND_GRADER = {"math": "final-number", "summarization": f"rouge-l>={ROUGE_L_MIN:g}",
                "translation": f"chrf>={CHRF_MIN:g}", "qa": "contains", "rag": "contains"}


def _combine(grader: str, checks: list[tuple[int, bool | None, float | None, str]]) -> GradeResult:
    """All graded turns must pass; the score (0..1) is their mean. Ungraded turns only add to the detail."""
    graded: list[tuple[bool, float]] = []
    for i, ok, score, _ in checks:
        if ok is None:
            continue
        if score is None:  # every check that grades a turn also scores it
            raise ValueError(f"turn {i + 1} is graded but has no score")
        graded.append((ok, score))
    detail = "; ".join(f"turn {i + 1}: {d}" for i, _, _, d in checks)
    if not graded:
        return GradeResult(passed=None, score=None, grader=grader, detail=detail)
    return GradeResult(
        passed=all(ok for ok, _ in graded), score=sum(s for _, s in graded) / len(graded), grader=grader, detail=detail
    )


# --- user graders -----------------------------------------------------------------------------------------

_USER_RE = re.compile(r"^(?P<target>.+):(?P<fn>[A-Za-z_]\w*)(?:\s*>=\s*(?P<min>[0-9.]+))?$")


@functools.lru_cache(maxsize=16)
def load_user_grader(spec: str) -> tuple[Callable, float]:
    """Import "module:function" or "file.py:function" (optional ">=threshold" for float scores, default 0.5)."""
    m = _USER_RE.match(spec.strip())
    if not m:
        raise BadInput(f"user grader {spec!r}: expected 'module:function' or 'path/to/file.py:function'")
    target, fn_name = m["target"], m["fn"]
    try:
        threshold = float(m["min"]) if m["min"] else 0.5
    except ValueError:
        raise BadInput(f"user grader {spec!r}: bad threshold {m['min']!r}") from None
    try:
        if target.endswith(".py"):
            path = Path(target).expanduser()
            if not path.is_file():
                raise BadInput(f"user grader {spec!r}: file not found: {path}")
            mod_spec = importlib.util.spec_from_file_location(f"specledger_user_grader_{path.stem}", path)
            if mod_spec is None or mod_spec.loader is None:
                raise BadInput(f"user grader {spec!r}: cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except SpecLedgerError:
        raise
    except Exception as exc:  # the user's module failed to import: say so in one line
        raise BadInput(f"user grader {spec!r}: cannot import {target!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise BadInput(f"user grader {spec!r}: {target!r} has no function {fn_name!r}")
    return fn, threshold


def _grade_user(spec: str, question: Question, answers: list[str]) -> GradeResult:
    fn, threshold = load_user_grader(spec)
    name = f"user:{spec.strip()}"
    try:
        out = fn(question, answers)
    except Exception as exc:
        raise SpecLedgerError(
            f"user grader {spec!r} raised {type(exc).__name__} on question {question.question_id}: {exc}"
        ) from None
    if isinstance(out, GradeResult):
        return out
    if out is None:
        return GradeResult(passed=None, score=None, grader=name, detail="grader returned None")
    if isinstance(out, bool):
        return GradeResult(passed=out, score=float(out), grader=name)
    if isinstance(out, (int, float)):
        return GradeResult(passed=float(out) >= threshold, score=float(out), grader=f"{name}>={threshold:g}")
    raise SpecLedgerError(
        f"user grader {spec!r} returned {type(out).__name__} on question {question.question_id}; "
        "expected bool, float or GradeResult"
    )


# --- entry point ------------------------------------------------------------------------------------------


def grade(question: Question, answers: list[str], user_grader: str | None = None) -> GradeResult:
    """Grade the model's answers (one per turn) to a question; passed=None when no grader applies."""
    if user_grader:
        return _grade_user(user_grader, question, answers)
    if question.code is not None:
        return grade_code(question, answers[-1] if answers else None)
    kind_grader = _KIND_GRADER.get(question.kind)
    refs = [(i, r) for i, r in enumerate(question.reference or ()) if i < len(question.turns)
            and any(a.strip() for a in _alternatives(r)) and (_entry_is_rule(r) or kind_grader)]
    if not refs:
        reason = "no reference" if not question.reference else f"no grader for kind {question.kind} without rules"
        return GradeResult(passed=None, score=None, grader="none", detail=reason)
    rules = [_entry_is_rule(r) for _, r in refs]  # (refs keeps a non-rule reference only when its kind has a grader)
    grader = "rules" if all(rules) else f"{kind_grader}+rules" if any(rules) else str(kind_grader)
    checks: list[tuple[int, bool | None, float | None, str]] = [
        (i, False, 0.0, "no answer") if i >= len(answers) or answers[i] is None
        else (i, *_check_entry(question.kind, ref, answers[i])) for i, ref in refs]
    return _combine(grader, checks)


def grade_code(question: Question, answer: str | None) -> GradeResult:
    """Run the task's tests against the answer's code in the sandbox (quality/execute.py): seconds, not micro-."""
    from specledger.quality.execute import grade_program

    assert question.code is not None
    r = grade_program(answer or "", question.code)
    return GradeResult(passed=r.passed, score=float(r.passed), grader="tests", detail=r.message, outcome=r.outcome)


_RULES = {
    "math": "the answer's final number equals the reference's",
    "summarization": f"ROUGE-L F1 against the reference >= {ROUGE_L_MIN:g}",
    "translation": f"chrF against the reference >= {CHRF_MIN:g}",
    "qa": "the answer contains the reference, normalised (lower case; punctuation and articles dropped; whole words)",
    "rag": "the answer contains the reference, normalised (lower case; punctuation and articles dropped; whole words)",
    "code": "the answer's code runs the task's tests in a sandbox (own process and directory, time, memory and "
            "process limits, no network where the OS allows): passed, failed, error or timeout",
    "multi_turn": "only by explicit rules in the reference (contains:A|B, number:X); other references are not checked",
}
GRADING_NOTE = ("every kind: a list of acceptable answers passes on any of them (best score); rules (contains:/number:) "
                "apply to any kind; turns without a reference are not graded; a question passes when all graded turns do")


def grading_rules(kinds: list[str] | set[str], user_grader: str | None = None) -> dict[str, str]:
    """How each kind is graded, in words (the run summary and the report print it, with GRADING_NOTE)."""
    if user_grader:
        return {k: f"user grader {user_grader.strip()}" for k in sorted(kinds)}
    return {k: _RULES.get(k, "no grader") for k in sorted(kinds)}

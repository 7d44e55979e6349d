"""The built-in graded workload: deterministic, large enough, every kind, answers its graders can check."""

from __future__ import annotations

from collections import Counter

from specledger.bench.graded import graded_questions
from specledger.records.question import KINDS
from specledger.bench.workload import load_workload
from specledger.quality.graders import grade


def test_seeded_large_and_covers_every_kind():
    qs = load_workload("builtin-graded")
    assert len(qs) >= 300 and len({q.question_id for q in qs}) == len(qs)
    assert qs == load_workload("builtin-graded")  # same seed, same items
    assert [q.turns for q in graded_questions(40, seed=1)] != [q.turns for q in graded_questions(40, seed=0)]
    assert set(Counter(q.kind for q in qs)) == set(KINDS) - {"code"}  # (code tasks are HumanEval's, not built in)
    assert set(Counter(q.kind for q in qs[:8])) == set(KINDS) - {"code"}  # any prefix covers every kind
    assert all(q.max_tokens and q.max_tokens <= 24 for q in qs)  # short answers
    assert all(q.system == "Answer with the answer only." for q in qs)  # ... asked for as such


def test_every_item_is_graded_and_its_reference_answer_passes():
    """An answer that is exactly the reference passes; an unrelated one fails (no item grades everything)."""
    for q in load_workload("builtin-graded"):
        rule = q.reference[-1]
        name, arg = rule.split(":", 1)
        right = arg.split("|")[0]
        answers = ["OK"] * (len(q.turns) - 1)
        good = grade(q, answers + [right])
        bad = grade(q, answers + ["Sorry, I cannot help with that."])
        assert good.passed is True, (q.question_id, rule, good.detail)
        assert bad.passed is False, (q.question_id, rule, bad.detail)


def test_word_and_caps_rules():
    from specledger.records.question import Question

    yn = Question("1", "yes-no", "qa", ("Is ice cold? Answer yes or no.",), ("word:yes",))
    assert grade(yn, ["Yes, it is."]).passed and grade(yn, ["**yes**"]).passed
    assert not grade(yn, ["No. Ice is not yes."]).passed  # only the first word counts
    caps = Question("2", "format", "qa", ("...",), ("caps:APPLE",))
    assert grade(caps, ["APPLE"]).passed and grade(caps, ['"APPLE".']).passed
    assert not grade(caps, ["Apple"]).passed and not grade(caps, ["The word is APPLE"]).passed

"""Spec-Bench's published question.jsonl loads whole: every `reference` shape, RAG lists of acceptable answers,
integer or string ids, and skipped lines counted per kind (never silent). Lines written from the format's
description (no copy of the file)."""

from __future__ import annotations

import json
import re

import pytest

from specledger.records.results import RunResult
from specledger.bench.tables import workload_text
from specledger.records.question import Question
from specledger.bench.workload import open_workload
from specledger.errors import BadInput
from specledger.quality.graders import grade, grading_rules

# One line per shape the published file uses (MT-Bench lines have none or a list of two long answers).
LINES = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku about rain.", "Now one about snow."]},
    {"question_id": 111, "category": "math", "turns": ["Area of a 3x4 rectangle?", "And its perimeter?"],
     "reference": ["The area is 12.", "The perimeter is 14."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate German to English: Guten Morgen."],
     "reference": ["Good morning."]},
    {"question_id": 241, "category": "summarization", "turns": ["Summarize: the cat sat on the mat all day."],
     "reference": ["The cat sat on the mat."]},
    {"question_id": 321, "category": "qa", "turns": ["Who wrote Hamlet?"]},
    {"question_id": "401", "category": "math_reasoning", "turns": ["Tom has 3 apples and buys 4. How many?"],
     "reference": ["3 + 4 = 7\n#### 7"]},
    {"question_id": 481, "category": "rag", "turns": ["Given the passage about forests: what are trees used for?"],
     "reference": [["a source of lumber", "purifying water", "habitat for animals"]]},
    {"question_id": 482, "category": "rag", "turns": ["What do bees make?"], "reference": "honey"},
]


def write(tmp_path, rows, name="question.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_every_reference_shape_loads_with_nothing_skipped(tmp_path):
    w = open_workload(str(write(tmp_path, LINES)))
    by_id = {q.question_id: q for q in w.questions}
    assert list(by_id) == ["81", "111", "161", "241", "321", "401", "481", "482"]
    assert by_id["81"].reference is None and by_id["321"].reference is None
    assert by_id["111"].reference == ("The area is 12.", "The perimeter is 14.")
    assert by_id["161"].reference == ("Good morning.",)
    assert by_id["401"].kind == "math" and by_id["401"].reference == ("3 + 4 = 7\n#### 7",)
    assert by_id["481"].reference == (("a source of lumber", "purifying water", "habitat for animals"),)
    assert by_id["482"].reference == ("honey",)
    assert w.info.format == "spec-bench" and "turns" in w.info.chosen
    assert w.info.skipped == {} and w.info.read == 8
    assert w.info.by_kind == {"multi_turn": 2, "translation": 1, "summarization": 1, "qa": 1, "math": 1, "rag": 2}
    assert w.info.with_reference == {"multi_turn": 1, "translation": 1, "summarization": 1, "math": 1, "rag": 2}


def test_reference_lists_per_turn_mixed_and_empty(tmp_path):
    rows = [{"question_id": 1, "category": "rag", "turns": ["a?", "b?"], "reference": [["x", "y"], None]},
            {"question_id": 2, "category": "rag", "turns": ["a?", "b?"], "reference": ["plain", ["p", "q"]]},
            {"question_id": 3, "category": "qa", "turns": ["a?"], "reference": [[]]},
            {"question_id": 4, "category": "qa", "turns": ["a?"], "reference": [1945]}]
    a, b, c, d = open_workload(str(write(tmp_path, rows))).questions
    assert a.reference == (("x", "y"), "")
    assert b.reference == ("plain", ("p", "q"))
    assert c.reference is None  # an empty list of answers: nothing to grade against
    assert d.reference == ("1945",)


@pytest.mark.parametrize("reference", [{"a": 1}, [{"a": 1}], [["ok", {"a": 1}]], True])
def test_reference_of_another_shape_is_a_bad_line_named_by_kind(tmp_path, reference):
    path = write(tmp_path, [LINES[0], {"question_id": 9, "category": "rag", "turns": ["q"], "reference": reference}])
    with pytest.raises(BadInput) as err:
        open_workload(str(path))
    assert f"{path}:2: field 'reference'" in str(err.value) and "acceptable answers" in str(err.value)
    w = open_workload(str(path), on_bad_line="skip")
    assert w.info.skipped == {"rag": 1} and len(w.questions) == 1


def rag(*alternatives: str, kind: str = "rag") -> Question:
    return Question("r1", kind, kind, ("Q?",), (tuple(alternatives),))


def test_rag_passes_on_any_acceptable_answer_normalised():
    q = rag("a source of lumber", "purifying water", "habitat for animals")
    first = grade(q, ["Trees are mainly A SOURCE of lumber."])
    assert first.passed is True and "a source of lumber" in first.detail and first.grader == "contains"
    assert grade(q, ["They help with purifying water, too"]).passed is True
    miss = grade(q, ["Trees are green."])
    assert miss.passed is False and miss.score == 0.0 and "none of 3 acceptable answers" in miss.detail
    # whole words only, as for a single reference
    assert grade(rag("art", "music"), ["A party"]).passed is False


def test_acceptable_answers_for_other_kinds_take_the_best():
    math = Question("m", "math_reasoning", "math", ("Q?",), (("12", "twelve is 12.0"),))
    assert grade(math, ["so the answer is 12"]).passed is True
    assert grade(math, ["so the answer is 13"]).passed is False
    summ = Question("s", "summarization", "summarization", ("Q?",), (("zzz yyy", "the cat sat on the mat"),))
    g = grade(summ, ["the cat sat on the mat"])
    assert g.passed is True and g.score == pytest.approx(1.0) and "best of 2" in g.detail
    rules = Question("x", "writing", "multi_turn", ("Q?",), (("contains:rain", "contains:snow"),))
    assert grade(rules, ["Snowy days"]).passed is False and grade(rules, ["Snow falls"]).passed is True
    assert grade(rules, ["Snow falls"]).grader == "rules"


def test_grading_rules_say_how_each_kind_is_graded():
    rules = grading_rules({"rag", "math", "multi_turn"})
    assert list(rules) == ["math", "multi_turn", "rag"]
    assert "contains" in rules["rag"] and "normalised" in rules["rag"]
    assert "final number" in rules["math"] and "explicit rules" in rules["multi_turn"]
    assert grading_rules({"qa"}, "mod:fn") == {"qa": "user grader mod:fn"}


def test_skipped_lines_are_counted_per_kind_and_shown(tmp_path, capsys):
    rows = LINES + ["{broken", {"question_id": 500, "category": "rag", "turns": []},
                    {"question_id": 501, "category": "translation"}, {"question_id": 81, "category": "qa", "turns": ["dup"]}]
    w = open_workload(str(write(tmp_path, rows)), on_bad_line="skip")
    assert len(w.questions) == len(LINES)
    assert w.info.skipped == {"unreadable": 1, "rag": 1, "translation": 1, "qa": 1}
    assert len(capsys.readouterr().err.strip().splitlines()) == 4
    run = RunResult.model_validate({"run_id": "x", "created": "2026-01-01T00:00:00Z",
                                    "conditions": {"python": "3", "specledger": "0", "platform": "p"},
                                    "workload": w.info.model_dump()})
    text = workload_text(run).plain
    assert "skipped lines: 4 (qa 1, rag 1, translation 1, unreadable 1)" in text
    assert "8 questions" in text


def test_more_skips_than_shown_are_summed_in_one_warning(tmp_path, capsys):
    rows = [LINES[0]] + ["{bad"] * 8
    w = open_workload(str(write(tmp_path, rows)), on_bad_line="skip")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and "3 more" in err[-1]
    assert w.info.skipped == {"unreadable": 8} and len(w.info.skipped_examples) == 5


@pytest.mark.slow
def test_six_kinds_end_to_end_on_the_embedded_model(tmp_path):
    """A 6-question sample with every kind through the harness, the gates and the report: 0 skipped lines."""
    from specledger.records.config import parse_run_config
    from specledger.records.results import read_requests
    from specledger.bench.runner import run_benchmark
    from specledger.engine.registry import KNOWN_MODELS, known_model_path
    from specledger.ledger.price import price_run
    from specledger.report.html import write_report

    if known_model_path(KNOWN_MODELS["smollm2-135m"]) is None:
        pytest.skip("the embedded model is not installed")
    path = write(tmp_path, LINES)
    cfg = parse_run_config({
        "configs": [{"name": "ar", "strategy": "ar", "max_tokens": 4}],
        "workload": {"spec": str(path), "categories": ["writing", "translation", "summarization", "qa",
                                                       "math_reasoning", "rag"], "per_category": 1},
        "load": {"warmup": 0}, "bootstrap": 20, "verify_curve": False,
    })
    result, run_dir = run_benchmark(cfg, run_dir=tmp_path / "run", show_progress=False)
    w = result.workload
    assert w.questions == 6 and w.skipped == {} and set(w.by_kind) == {"multi_turn", "translation",
                                                                      "summarization", "qa", "math", "rag"}
    assert set(w.grading) == set(w.by_kind)
    recs = read_requests(run_dir)
    assert len(recs) == 7 and all(r.status == "ok" for r in recs)  # the writing question has two turns
    graders = {r.kind: r.grade.grader for r in recs if r.turn == r.turns}
    assert graders["rag"] == "contains" and graders["math"] == "final-number" and graders["qa"] == "none"
    by_kind = result.configs[0].loads[0].by_kind
    assert set(by_kind) == set(w.by_kind)
    report = write_report(run_dir, price_run(run_dir, None, samples=50), run_dir / "report.html").read_text()
    assert "Workload and grading" in report and "0 line(s) skipped" in report and "acceptable answers" in report
    assert re.search(r"<td>ar [01]/1</td>", report)  # per-kind pass counts (each graded kind has one question)

import sys

import pytest

from specledger.records.question import Question
from specledger.errors import BadInput, SpecLedgerError
from specledger.quality.graders import GradeResult, chrf, contains_any, final_number, grade, normalize, rouge_l


def q(kind: str, reference=None, turns=("Q?",), category=None) -> Question:
    return Question("x1", category or kind, kind, tuple(turns), tuple(reference) if reference else None)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 1,234.", 1234),
        ("It costs $8.75 in total.", 8.75),
        ("The temperature fell to -5 degrees.", -5),
        ("It was \u22125 \u00b0C at night", -5),
        ("About .5 of it", 0.5),
        ("Total: 1,000,000.25 dollars", 1_000_000.25),
        ("24 + 18 = 42. Then 42 - 35 = 7. So 7 muffins are left.", 7),
        ("The answer is 7. This was problem 2 of 3.", 7),
        ("To find the answer: 24 + 18 = 42, 42 - 35 = 7.", 7),
        ("Working...\n#### 150", 150),
        ("\\boxed{3/4}", 0.75),
        ("read pages 3-4", 4),
        ("no digits here", None),
    ],
)
def test_final_number(text, expected):
    got = final_number(text)
    assert got == (None if expected is None else pytest.approx(expected))


def test_math_grader_compares_final_numbers():
    question = q("math", ["-5"])
    assert grade(question, ["4 - 9 = -5, so the answer is -5 degrees."]).passed is True
    assert grade(question, ["It is 5 degrees."]).passed is False
    r = grade(q("math", ["1200"]), ["She needs $1,200.00."])
    assert (r.passed, r.grader, r.score) == (True, "final-number", 1.0)


def test_rouge_l_hand_computed():
    # LCS of [the cat sat on the mat] and [the cat is on the mat] is 5 words: P = R = 5/6
    assert rouge_l("The cat sat on the mat.", "the cat is on the mat") == pytest.approx(5 / 6)
    # LCS(a b c d, b d e) = 2: P = 1/2, R = 2/3, F = 4/7
    assert rouge_l("a b c d", "b d e") == pytest.approx(4 / 7)
    assert rouge_l("", "a") == 0.0 and rouge_l("x y", "a b") == 0.0


def test_chrf_hand_computed():
    # "ab" vs "abc": n=1 P 1 R 2/3; n=2 P 1 R 1/2; n=3 P 0 R 0 (n>3: reference too short, left out)
    # P = 2/3, R = 7/18, F2 = 5PR / (4P + R) = 14/33
    assert chrf("ab", "abc") == pytest.approx(100 * 14 / 33)
    assert chrf("a b c", "abc") == pytest.approx(100.0)  # whitespace is ignored
    assert chrf("the cat", "the cat") == pytest.approx(100.0)
    assert chrf("xyz", "abc") == 0.0 and chrf("", "abc") == 0.0


def test_summarization_and_translation_thresholds():
    ref = "the city will replace three diesel ferries with electric boats"
    good = grade(q("summarization", [ref]), ["The city will replace its three diesel ferries with electric boats soon."])
    assert good.passed and good.grader.startswith("rouge-l>=") and good.score > 0.8
    assert grade(q("summarization", [ref]), ["Bananas are yellow."]).passed is False
    tr = q("translation", ["The cat has been sleeping on the sofa since this morning."])
    assert grade(tr, ["The cat has slept on the sofa since this morning."]).passed is True
    assert grade(tr, ["Le chat dort."]).passed is False


def test_normalised_containment_for_qa_and_rag():
    assert normalize("The  Pacific Ocean!") == "pacific ocean"
    assert contains_any("It is the Pacific.", ["pacific"]) == "pacific"
    assert contains_any("about 14 km", ["4"]) is None  # whole words only
    r = grade(q("qa", ["seven|7"]), ["There are 7 continents."])
    assert (r.passed, r.grader) == (True, "contains")
    assert grade(q("rag", ["Thomas Avery"]), ["thomas avery."]).detail == "turn 1: exact match"
    assert grade(q("qa", ["Canberra"]), ["Sydney"]).passed is False


def test_rules_per_turn_and_multi_turn_without_rules():
    mt = q("multi_turn", ["contains:Carla", "number:42"], turns=("t1", "t2"), category="reasoning")
    r = grade(mt, ["Carla is the shortest.", "So 2 * (16 + 5) = 42 metres."])
    assert (r.passed, r.grader, r.score) == (True, "rules", 1.0)
    r = grade(mt, ["Carla is the shortest.", "About 40 metres."])
    assert r.passed is False and r.score == 0.5 and "turn 2" in r.detail
    assert grade(mt, ["Carla"]).passed is False  # a missing answer fails its check
    # MT-Bench style references (long model answers) are not checkable: no grader
    long_ref = q("multi_turn", ["A long reference answer."], category="writing")
    assert grade(long_ref, ["anything"]).passed is None
    assert grade(q("qa"), ["anything"]) == GradeResult(None, None, "none", "no reference")


def test_user_grader_module_and_file(tmp_path, monkeypatch):
    mod = tmp_path / "my_grader_mod.py"
    mod.write_text(
        "def strict(question, answers):\n    return answers[-1].strip() == 'yes'\n"
        "def fuzzy(question, answers):\n    return 0.6\n"
        "def broken(question, answers):\n    raise ValueError('boom')\n"
        "def weird(question, answers):\n    return 'maybe'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    question = q("qa", ["x"])
    r = grade(question, ["yes"], user_grader="my_grader_mod:strict")
    assert (r.passed, r.score, r.grader) == (True, 1.0, "user:my_grader_mod:strict")
    assert grade(question, ["no"], user_grader=f"{mod}:strict").passed is False
    assert grade(question, ["no"], user_grader="my_grader_mod:fuzzy").passed is True
    assert grade(question, ["no"], user_grader="my_grader_mod:fuzzy>=0.7").passed is False
    with pytest.raises(BadInput, match="cannot import"):
        grade(question, ["a"], user_grader="no_such_module_xyz:fn")
    with pytest.raises(BadInput, match="no function 'nope'"):
        grade(question, ["a"], user_grader="my_grader_mod:nope")
    with pytest.raises(BadInput, match="expected 'module:function'"):
        grade(question, ["a"], user_grader="justaname")
    with pytest.raises(SpecLedgerError, match="raised ValueError on question x1"):
        grade(question, ["a"], user_grader="my_grader_mod:broken")
    with pytest.raises(SpecLedgerError, match="returned str"):
        grade(question, ["a"], user_grader="my_grader_mod:weird")
    sys.modules.pop("my_grader_mod", None)


def test_unusable_reference_leaves_the_turn_ungraded_and_scores_stay_in_0_1():
    r = grade(q("math", ["about a dozen"]), ["12"])
    assert r.passed is None and "holds no number" in r.detail
    mixed = q("math", ["number:3", "no digits"], turns=("a", "b"))
    r = grade(mixed, ["3", "4"])
    assert (r.passed, r.score) == (True, 1.0) and "turn 2" in r.detail
    tr = grade(q("translation", ["Good morning"]), ["Good morning"])
    assert tr.score == pytest.approx(1.0) and "chrf 100.0" in tr.detail

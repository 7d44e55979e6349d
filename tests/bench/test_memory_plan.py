"""A run's memory (issue 54, item 4): arms that share a file share its weights; a matrix that does not fit the
budget runs in groups that do, each with a copy of an anchor arm, or is refused in one line; never an OOM kill."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specledger.decoding.loop.runner import PARK_BYTES
from specledger.bench.memory_plan import GROUP_TAG, HEADROOM, arm_cost, group_bytes, in_flight, plan
from specledger.bench.runner import Runner
from specledger.bench.shared_models import SharedModels
from specledger.engine.pool import ModelPool
from specledger.errors import BadInput
from specledger.records.config import parse_run_config
from specledger.records.question import Question
from tests.support.fake_backend import SleepBackend

ARMS = [{"name": "ar-w4", "dtype": "bf16", "quant": "int4"},
        {"name": "ar-w4a8", "dtype": "bf16", "quant": "int4", "activations": 8},
        {"name": "ar-bf16", "dtype": "bf16"},
        {"name": "lookup-w4", "strategy": "lookup", "dtype": "bf16", "quant": "int4"},
        {"name": "ar-fp32", "dtype": "fp32"}]
QUESTIONS = [Question("1", "qa", "qa", ("a short question",))]


def run_config(arms=ARMS, **kw):
    return parse_run_config({"configs": [{"max_tokens": 4, **a} for a in arms], "gates": {"quantization": False},
                             **kw})


def costs_of(cfg, slots=None):
    shared = SharedModels(cfg, ModelPool())
    return shared, {bc.name: arm_cost(bc, shared.keys, 64, slots) for bc in cfg.configs}


def test_w4a16_and_w4a8_of_one_file_are_counted_once():
    cfg = run_config()
    _, c = costs_of(cfg)
    w4, a8 = c["ar-w4"], c["ar-w4a8"]
    assert w4.weights.keys() == a8.weights.keys() and sum(w4.weights.values()) > 100e6  # the embedded model's W4
    # the second adds its KV cache only
    assert group_bytes([w4, a8], 0) == pytest.approx(group_bytes([w4], 0) + a8.own * HEADROOM, abs=2)
    assert group_bytes([w4, c["lookup-w4"]], 0) == pytest.approx(group_bytes([w4], 0) + c["lookup-w4"].own * HEADROOM,
                                                                 abs=2)


def test_arms_that_do_not_fit_run_in_groups_each_with_an_anchor_copy():
    cfg = run_config()
    _, c = costs_of(cfg)
    everything = group_bytes(c.values(), 0)
    fp32 = group_bytes([c["ar-fp32"], c["ar-w4"]], 0)
    budget = fp32 + 1  # fp32 with the anchor fits; not everything
    assert everything > budget
    p = plan(cfg.configs, SharedModels(cfg, ModelPool()).keys, QUESTIONS, interleaved=True, limit=(budget, "test"),
             base=0)
    names = [[bc.name for bc in g] for g in p.groups]
    assert len(names) > 1 and all(peak <= budget for peak in p.peaks)
    assert names[0][0] == "ar-w4"  # the cheapest `ar` arm anchors every group
    assert [g[0] for g in names[1:]] == [f"ar-w4{GROUP_TAG}{k}" for k in range(2, len(names) + 1)]
    assert [bc.name for bc in p.added] == [g[0] for g in names[1:]]
    arms = sorted(n for g in names for n in g if GROUP_TAG not in n)
    assert arms == sorted(a["name"] for a in ARMS)  # every arm once
    assert "ar-w4a8" in names[0]  # it shares the anchor's codes: no new weights, its KV and parked prompts only
    # a resumed run: the recorded copies are placed again, not added twice
    again = plan([*cfg.configs, *p.added], SharedModels(cfg, ModelPool()).keys, QUESTIONS, interleaved=True,
                 limit=(budget, "test"), base=0)
    assert again.added == [] and [[bc.name for bc in g] for g in again.groups] == names


def test_an_arm_that_does_not_fit_alone_is_refused_naming_it_and_the_bytes():
    cfg = run_config()
    _, c = costs_of(cfg)
    budget = group_bytes([c["ar-bf16"]], 0) + 1  # every arm fits alone but the fp32 one
    with pytest.raises(BadInput, match=r"arm 'ar-fp32' alone needs \d+\.\d\d GiB .* more than the \d+\.\d\d GiB"):
        plan(cfg.configs, SharedModels(cfg, ModelPool()).keys, QUESTIONS, interleaved=True, limit=(budget, "test"),
             base=0)


def test_one_arm_at_a_time_keeps_nothing_for_later_arms_when_they_do_not_fit():
    cfg = run_config(interleave=False)
    _, c = costs_of(cfg)
    keys = SharedModels(cfg, ModelPool()).keys
    assert not plan(cfg.configs, keys, QUESTIONS, interleaved=False, limit=(10**12, "test"), base=0).lean
    assert plan(cfg.configs, keys, QUESTIONS, interleaved=False, limit=(group_bytes([c["ar-fp32"]], 0), "t"),
                base=0).lean


def test_a_run_over_budget_runs_its_groups_one_after_another(tmp_path, monkeypatch):
    """The runner with SPECLEDGER_MEMORY_BUDGET low: group by group (every backend of a group closed before the next
    group's start), the anchor's copy measured in the later group and paired with the anchor as its A/A twin."""
    from specledger.bench.memory_plan import budget
    from specledger.records.results import load_run

    cfg = run_config(ARMS[:3], workload={"spec": "synthetic:in=20,out=4,n=2"}, load={"warmup": 0}, calibration=False,
                     verify_curve=False, threads=1, bootstrap=0)
    _, c = costs_of(cfg, in_flight(cfg))  # as the runner counts: one request in flight
    monkeypatch.setattr("specledger.bench.memory_plan.process_rss", lambda: 0)
    monkeypatch.setenv("SPECLEDGER_MEMORY_BUDGET", str(group_bytes([c["ar-w4"], c["ar-bf16"]], 0) + 1))
    assert budget()[0] < group_bytes(c.values(), 0)
    events: list[str] = []

    class Tracked(SleepBackend):
        async def start(self):
            events.append(f"start {self.config.name}")

        async def close(self):
            events.append(f"close {self.config.name}")

    calls: list[str] = []
    runner = Runner(cfg, tmp_path / "run", show_progress=False,
                    backend_factory=lambda bc: Tracked(bc, calls, lambda n, bc: 0.001))
    result = runner.run()
    copy = f"ar-w4{GROUP_TAG}2"
    assert [[bc.name for bc in g] for g in runner.memory.groups] == [["ar-w4", "ar-w4a8"], [copy, "ar-bf16"]]
    assert events.index("close ar-w4a8") < events.index(f"start {copy}")  # the first group gone before the second
    assert {cr.name for cr in result.configs} == {"ar-w4", "ar-w4a8", "ar-bf16", copy}
    run = load_run(tmp_path / "run")
    assert any("2 groups" in n for n in run.notes)
    drift = next(n for n in run.notes if n.startswith("drift between memory groups"))
    assert f"{copy} c=1" in drift and "against ar-w4's" in drift and drift.endswith("x)")
    from specledger.records.config import config_baselines

    assert config_baselines(runner.cfg.configs)[copy] == "ar-w4"  # the A/A arm between the groups


def test_shared_models_hand_w4a8_the_w4a16_codes_without_loading(tmp_path, monkeypatch):
    from tests.engine.test_qwen import save_qwen

    path = str(save_qwen(tmp_path / "q"))
    cfg = parse_run_config({"configs": [{"name": "a", "model": path, "dtype": "bf16", "quant": "int4"},
                                        {"name": "b", "model": path, "dtype": "bf16", "quant": "int4",
                                         "activations": 8}], "gates": {"quantization": False}})
    shared = SharedModels(cfg, ModelPool())
    w4 = shared.load_target(cfg.configs[0])
    monkeypatch.setattr("specledger.engine.loader.load_model", lambda *a, **k: pytest.fail("loaded again"))
    a8 = shared.for_config(cfg.configs[1])["target"]
    assert (a8.activations, w4.activations) == (8, 16) and a8.model is not w4.model

    def ptrs(m):
        return sorted(t.data_ptr() for t in [*m.parameters(), *m.buffers()])

    assert ptrs(a8.model) == ptrs(w4.model)
    from specledger.engine.quant import _Quantized

    kernels = [(m.digits, n.digits) for m, n in zip(a8.model.modules(), w4.model.modules())
               if isinstance(m, _Quantized) and m.kernel_layout() is not None]
    assert kernels and set(kernels) == {(1, 2)}  # one int8 digit an activation in the twin, two in the original
    assert shared.load_target(cfg.configs[1]) is a8


def test_the_cli_refuses_a_matrix_over_budget_in_one_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("configs:\n  - {name: ar-fp32, dtype: fp32, max_tokens: 4}\nworkload: {spec: builtin}\n")
    env = {"SPECLEDGER_MEMORY_BUDGET": "64M", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "specledger.cli", "bench", str(p), "--output-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, env=env, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert lines[-1].startswith("error: memory: arm 'ar-fp32' alone needs") and "SPECLEDGER_MEMORY_BUDGET" in lines[-1]
    assert "Traceback" not in r.stderr


def test_the_gates_fp32_reference_is_a_reading_peak_before_the_arms_not_weights_every_group_holds():
    """The quantization gate's fp32 model is read once before any arm (bench/shared_models.read_references): the plan
    counts it as a peak of its own, and each group holds only its log-probabilities (the pair recipe predicted
    24.7 GiB with the 1.5B's fp32 reference held in every group)."""
    from specledger.bench.memory_plan import logprob_bytes, reading_bytes

    cfg = parse_run_config({"configs": [{"max_tokens": 4, **a} for a in ARMS[:2]]})  # the gate on: W4A16, W4A8
    shared = SharedModels(cfg, ModelPool())
    ref = shared.reference_key(cfg.configs[0])
    assert ref is not None and ref[1:3] == ("fp32", "none") and "reference" not in shared.keys(cfg.configs[0])
    off = plan(cfg.configs, shared.keys, QUESTIONS, interleaved=True, limit=(10**12, "t"), base=0)
    on = plan(cfg.configs, shared.keys, QUESTIONS, interleaved=True, limit=(10**12, "t"), base=0,
              reference_of=shared.reference_key)
    kept = logprob_bytes(ref)
    assert 10e6 < kept < reading_bytes(ref) / 4  # 49,152 x ~1,000 x 4 bytes beside 540 MB of fp32 weights
    assert on.peaks[0] == off.peaks[0] + kept  # a group holds the log-probabilities, not the fp32 weights
    assert on.reading == kept + int(reading_bytes(ref) * HEADROOM) and on.peak == max(on.reading, on.peaks[0])
    assert "reading the quantization gate's fp32 reference" in on.text()
    with pytest.raises(BadInput, match=r"reading the quantization gate's fp32 reference \(for ar-w4, ar-w4a8\) needs .*quantization: false"):
        plan(cfg.configs, shared.keys, QUESTIONS, interleaved=True, limit=(on.reading - 1, "t"), base=0,
             reference_of=shared.reference_key)


def test_an_arms_kv_caches_are_the_requests_the_run_has_in_flight_not_every_slot_of_its_batch():
    cfg = run_config(ARMS[:1], load={"concurrency": [1, 4]}, quality={"spec": "builtin-graded", "concurrency": 2})
    assert in_flight(cfg) == 4 and in_flight(run_config(ARMS[:1], load={"rate": [2.0]})) is None
    bc = cfg.configs[0]
    every, four = (arm_cost(bc, SharedModels(cfg, ModelPool()).keys, 1000, n).own for n in (None, 4))
    # the slots' caches scale with the requests in flight; the prompts parked in host memory are capped apart
    assert bc.batch_size == 16 and (four - PARK_BYTES) * 4 == every - PARK_BYTES


PROSE = ("The committee met on Tuesday to review the quarterly budget, the hiring plan and the schedule for the new "
         "office. ") * 11  # ~1,250 characters: ~420 tokens at 3 characters a token, ~250 in SmolLM2's


def test_the_plan_counts_prompts_in_the_models_own_tokens():
    """A slot cache grows by doubling: the plan must reach the capacity the prompt really needs, not the one 3
    characters a token would give (HumanEval's longest prompt: 531 such 'tokens', 463 of Qwen's)."""
    from specledger.bench.memory_plan import PAST_AR, _tokenizer, context_tokens, kv_bytes, prompt_tokens

    tok = _tokenizer("smollm2-135m")
    assert tok is not None
    qs = [Question("prose", "qa", "qa", (PROSE,)),
          Question("sys", "qa", "qa", ("Summarise it.", PROSE), system="You are terse."),
          Question("pre", "code", "code", ("Write a function that adds two numbers.",), prefill="```python\n")]
    for q in qs:  # as the backend sends the last turn: earlier answers empty here (counted as max_tokens apart)
        msgs = [{"role": "system", "content": q.system}] if q.system else []
        for i, t in enumerate(q.turns):
            msgs += [{"role": "user", "content": t}] + ([{"role": "assistant", "content": ""}]
                                                        if i < len(q.turns) - 1 else [])
        assert abs(prompt_tokens([q], tok)[0] - len(tok.chat(q.sent(msgs)))) <= PAST_AR, q.question_id
    one = [qs[0]]
    exact, by_chars = context_tokens(one, 200, tok), context_tokens(one, 200)
    assert exact + PAST_AR <= 512 < by_chars + PAST_AR  # the two land on different capacities
    cfg = run_config(ARMS[:1])
    keys = SharedModels(cfg, ModelPool()).keys
    p = plan(cfg.configs, keys, [q.__class__(**{**q.__dict__, "max_tokens": 200}) for q in one], interleaved=True,
             limit=(10**12, "t"), base=0, in_flight=1)
    (key,) = keys(cfg.configs[0]).values()
    want = arm_cost(cfg.configs[0], keys, exact, 1)
    parked = PARK_BYTES if cfg.configs[0].prefix_cache else 0
    assert want.own - parked == kv_bytes(key, 1, 512) and p.peaks == [group_bytes([want], 0)]

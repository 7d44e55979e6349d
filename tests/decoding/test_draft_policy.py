"""Draft policies in the continuous batch: `fixed` drafts min(K, room) every step whatever was accepted, and is
lossless; `draft_length` goes from the command line or a run configuration to the scheduler and into the recorded
params; `compare --arms` expands into no speculation, fixed K and adaptive, each gated against autoregressive."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner
from tests.support.varied_model import BATCHING_VOCAB, alone, random_head, run_all, run_joining, varied_model, varied_prompts

from specledger.decoding.sizing.planner import CostSurface
from specledger.decoding.sizing.policy import Adaptive, FixedK
from specledger.decoding.factory import check_params, make_strategy
from specledger.decoding.drafters.lookup import LookupDrafter
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import Scheduler
from specledger.errors import BadInput

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


K = 4
SURFACE = CostSurface((1, 2, 3, 9), (1.0, 1.3, 1.6, 3.4))  # a draft pays only while a token's chance is > ~0.3


class Rejected(LookupDrafter):
    """Proposes all it is asked for, tokens the target almost never picks: the planner soon stops drafting them."""

    def _chain(self, seq, budget: int) -> list[int]:
        return [(seq.tokens[-1] + 1) % BATCHING_VOCAB] * min(self.max_nodes, budget)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, BATCHING_VOCAB, (n,), generator=g).tolist() * 2 for n in (5, 9, 3)]


@pytest.mark.parametrize("max_batch", [1, 3])
def test_fixed_k_drafts_k_every_step_whatever_is_accepted(lm, max_batch):
    """Every decoding sequence's draft is min(K, its room) nodes in every pass, its last ones included, though
    nearly all are rejected; the adaptive planner, on the same drafter and surface, cuts them."""
    proposed = {}
    for policy in ("fixed", "adaptive"):
        sched = Scheduler(lm, max_batch=max_batch, drafter=Rejected(K), cost=SURFACE, draft_length=policy)
        assert sched.spec is not None
        sizes: list[tuple[int, int]] = []
        plan = sched.spec.plan

        def record(states, caps, prefill_rows, plan=plan, sizes=sizes):
            trees = plan(states, caps, prefill_rows)
            sizes.extend((len(t), c) for t, c in zip(trees, caps))
            return trees

        sched.spec.plan = record  # type: ignore[method-assign]
        for p in prompts():
            sched.add(p, SamplingParams(max_tokens=30, temperature=0.0))
        results = run_all(sched)
        levels = [r.levels[0] for r in results]
        proposed[policy] = sum(lv.proposed for lv in levels)
        if policy == "fixed":
            assert isinstance(sched.spec.policy, FixedK)
            assert sizes and all(n == min(K, cap) for n, cap in sizes), sizes
            assert {cap for _, cap in sizes} >= {0, 1, 2, 3} and max(cap for _, cap in sizes) > K  # room, then K
            assert sum(lv.accepted for lv in levels) < proposed[policy] / 4  # nearly every draft rejected
            assert all(r.params["draft_length"] == "fixed" for r in results)
        else:
            assert isinstance(sched.spec.policy, Adaptive)
            assert all(r.params["draft_length"] == "adaptive" for r in results)
    assert 0 < proposed["adaptive"] < proposed["fixed"] / 4


def fixed_strategy(name: str, lm):
    """The strategy as a user gives it, with draft_length=fixed among its parameters."""
    if name == "draft":
        return make_strategy("draft", lm, draft=varied_model(noise=0.1), num_tokens=K, draft_length="fixed")
    if name == "eagle":
        return make_strategy("eagle", lm, head=random_head(lm), top_k=3, depth=3, total_nodes=6,
                             draft_length="fixed")
    if name == "hier":  # K = max_chain: each step the intermediate builds a chain of up to K from lookup's trees
        return make_strategy("hier", lm, intermediate=varied_model(noise=0.1), drafter="lookup", lookup_tokens=3,
                             min_chain=2, max_chain=K, draft_length="fixed")
    return make_strategy("lookup", lm, num_tokens=K, draft_length="fixed")


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("name", ["lookup", "draft", "eagle", "hier"])
def test_greedy_output_under_fixed_k_equals_autoregressive(name, concurrency):
    """Lossless with every sequence drafting in every pass: sequences of different lengths joining and leaving,
    drafts accepted sometimes and rejected sometimes, each request's tokens those of `ar` alone."""
    lm = varied_model()
    strat = fixed_strategy(name, lm)
    sched = Scheduler(lm, max_batch=concurrency, prefill_chunk=8, drafter=strat.batch_drafter(concurrency),
                      draft_length=strat.draft_length)
    ps = [p[:n] for p, n in zip(varied_prompts(n=4, length=9, seed=2), (18, 5, 12, 3))]
    max_new = [30, 12, 25, 20]
    results = run_joining(sched, ps, max_new)
    for i, p in enumerate(ps):
        want = alone(lm, p, SamplingParams(max_tokens=max_new[i], temperature=0.0))
        assert results[i].token_ids == want.token_ids, i
    levels = [r.levels[-1] for r in results.values()]  # (a hierarchy's: the chains the target verified)
    proposed, accepted = sum(lv.proposed for lv in levels), sum(lv.accepted for lv in levels)
    assert 0 < accepted < proposed, (accepted, proposed)
    if name != "lookup":  # (lookup drafts only where its n-gram recurs) every pass but a request's last drafts
        assert all(lv.drafts is not None and lv.steps is not None and lv.drafts >= lv.steps - 1 for lv in levels)
    assert all(r.params["draft_length"] == "fixed" for r in results.values())


# --- the parameter, from where a user gives it to the scheduler ----------------------------------------------


def test_every_drafting_strategy_takes_draft_length_and_refuses_others_in_one_line():
    from specledger.decoding.params import DRAFT_LENGTHS, STRATEGIES

    assert DRAFT_LENGTHS == ("adaptive", "fixed")
    needs = {"draft": {"draft": "target"}, "hier": {"intermediate": "target"}}
    for name in STRATEGIES:
        if name == "ar":
            with pytest.raises(BadInput, match="has no parameter 'draft_length'"):
                check_params(name, {"draft_length": "fixed"})
            continue
        for value in DRAFT_LENGTHS:
            assert check_params(name, {**needs.get(name, {}), "draft_length": value})["draft_length"] == value
        with pytest.raises(BadInput) as exc:
            check_params(name, {**needs.get(name, {}), "draft_length": "fixd"})
        assert str(exc.value) == (f"strategy {name!r} parameter draft_length='fixd': "
                                  "input should be 'adaptive' or 'fixed'")
    with pytest.raises(BadInput, match=r"^draft_length must be adaptive or fixed \(got 'fixd'\)$"):
        Scheduler(varied_model(), drafter=LookupDrafter(K), draft_length="fixd")


def test_draft_length_round_trips_through_a_run_configuration_and_the_flags(tmp_path):
    from specledger.records.config import parse_run_config
    from specledger.cli.bench import build_config

    cfg = parse_run_config({"configs": [{"name": "lk", "strategy": "lookup", "params": {"draft_length": "fixed"}},
                                        {"name": "lk2", "strategy": "lookup"}]})
    assert cfg.configs[0].params.given() == {"draft_length": "fixed"} and cfg.configs[1].params.given() == {}
    dumped = cfg.model_dump(mode="json")
    assert dumped["configs"][0]["params"] == {"draft_length": "fixed"}
    assert parse_run_config(dumped).model_dump(mode="json") == dumped
    with pytest.raises(BadInput, match=r"configs\.0\.params: strategy 'eagle' parameter draft_length='often'"):
        parse_run_config({"configs": [{"name": "e", "strategy": "eagle", "params": {"draft_length": "often"}}]})
    flags = build_config(None, strategies=["ar", "lookup"], backend="inprocess", model=None, dtype="fp32",
                         quant="none", group_size=32, params=["lookup.draft_length=fixed"], max_tokens=8,
                         temperature=0.0, seed=0, base_url=None, api="chat", tokenizer=None, retries=None,
                         timeout=None, connect_timeout=None, overrides={})
    assert [c.params.given() for c in flags.configs] == [{}, {"draft_length": "fixed"}]


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_the_inprocess_backend_and_the_server_run_the_configured_policy(monkeypatch, policy):
    """Both build their scheduler with the strategy's draft_length, and its results record it."""
    import asyncio

    from tests.conftest import tiny_model
    from specledger.bench.backends.inprocess import InProcessBackend
    from specledger.records.config import BenchConfig
    from specledger.decoding.sizing import policy as draft_policy
    from specledger.server.app import ServerState
    from tests.bench.test_harness_inprocess import CharTokenizer

    monkeypatch.setattr(draft_policy, "cost_surface", lambda *a, **k: CostSurface((1,), (1.0,)))
    lm = tiny_model(seed=3)
    lm.tokenizer = CharTokenizer(lm.config.vocab_size)
    bc = BenchConfig(name="lk", strategy="lookup", params={"draft_length": policy}, max_tokens=6)
    backend = InProcessBackend(bc, models={"target": lm})

    async def one():
        await backend.start()
        try:
            ran = backend.worker.scheduler.spec.policy.name
            return ran, await backend.complete([{"role": "user", "content": "abc abc abc"}], max_tokens=6)
        finally:
            await backend.close()

    ran, done = asyncio.run(one())
    assert ran == policy and done.ok
    state = ServerState(lm, make_strategy("lookup", lm, draft_length=policy), "tiny", max_queue=2, max_batch=2)
    sched = state.worker.scheduler  # (its thread starts with the app, not here)
    assert sched.spec is not None and sched.spec.policy.name == policy
    assert sched.params()["draft_length"] == policy


# --- compare --arms ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["lookup", "draft", "eagle", "hier"])
def test_arms_recipe_is_no_speculation_fixed_and_adaptive_each_gated_against_ar(strategy):
    from specledger.records.config import config_baselines
    from specledger.pipeline import arms_matrix, default_matrix

    cfg = arms_matrix(strategy)
    assert [c.name for c in cfg.configs] == ["ar", f"{strategy}-fixed", f"{strategy}-adaptive"]
    ar, fixed, adaptive = cfg.configs
    assert ar.strategy == "ar" and fixed.strategy == adaptive.strategy == strategy
    assert fixed.params.given() == {"draft_length": "fixed"} and adaptive.params.given() == {"draft_length": "adaptive"}
    assert fixed.batch_size > 1 and adaptive.batch_size > 1  # where draft_length acts
    # the lossless gate compares each arm with ar on the same target, greedy; the graded pass rate is ar's
    assert config_baselines(cfg.configs) == {"ar": "ar", f"{strategy}-fixed": "ar", f"{strategy}-adaptive": "ar"}
    assert all(c.greedy and not c.optional for c in cfg.configs)
    assert cfg.quality is not None and [cfg.quality_source(c) for c in cfg.configs] == ["ar", "ar", "ar"]
    assert cfg.gates.lossless_min_share == 1.0
    assert cfg.load.concurrency == list(default_matrix().load.concurrency) and len(cfg.load.concurrency) > 1
    if strategy == "draft":
        assert fixed.draft == adaptive.draft and fixed.draft is not None
    if strategy == "hier":
        assert fixed.intermediate == adaptive.intermediate and fixed.intermediate is not None
    assert [c.max_tokens for c in arms_matrix(strategy, quick=True).configs] == [32] * 3


def test_compare_arms_flag_expands_into_the_three_configurations(monkeypatch):
    from specledger import pipeline
    from specledger.cli import app

    seen = []
    monkeypatch.setattr(pipeline, "run_compare", lambda config, **kw: seen.append(config))
    r = CliRunner().invoke(app, ["compare", "--arms", "lookup", "--concurrency", "1,4,16", "--max-tokens", "8"])
    assert r.exit_code == 0, r.output
    [cfg] = seen
    assert [c.name for c in cfg.configs] == ["ar", "lookup-fixed", "lookup-adaptive"]
    assert cfg.load.concurrency == [1, 4, 16] and {c.max_tokens for c in cfg.configs} == {8}
    for args, needle in ((["--arms", "medusa"], "--arms takes a strategy that drafts in a batch (lookup, draft, "
                                                "eagle, hier), got 'medusa'"),
                         (["--arms", "ar"], "got 'ar'"),
                         (["--arms", "lookup", "--config", "x.yaml"], "--arms and --config each give the "
                                                                       "configurations: give one of them")):
        r = CliRunner().invoke(app, ["compare", *args])
        assert isinstance(r.exception, BadInput) and needle in str(r.exception), r.output

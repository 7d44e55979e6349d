"""Strategies are lossless: greedy outputs equal autoregressive ones; sampled outputs follow the target.

The distribution checks are chi-square tests over many seeded samples of the first tokens
of a tiny model with a 4-token vocabulary, at significance level 0.001 (fixed seeds, so
the outcome is deterministic). A negative control shows the test rejects a wrong sampler.
"""


import pytest
import torch

from tests.conftest import TEMP, chi2_pvalue, exact_joint, tiny_model
from tests.support.varied_model import assert_lossless_and_mixed, varied_model, varied_prompts
from specledger.decoding.factory import make_strategy
from specledger.decoding import sampling
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.tree import Tree
from specledger.decoding.verify import verify
from specledger.errors import BadInput

ALPHA = 1e-3
N_SAMPLES = 1500

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.mark.parametrize("name", ["lookup", "draft", "hier-lookup", "hier-eagle"])
def test_greedy_strategies_equal_autoregressive_on_tiny(name):
    """On a model whose greedy output varies, proposals are accepted sometimes and rejected sometimes."""
    lm = varied_model()
    mid = varied_model(noise=0.1)  # mostly agrees with the target, as a draft or intermediate should
    params = {
        "lookup": {"num_tokens": 3},
        "draft": {"draft": mid, "num_tokens": 3},
        "hier-lookup": {"intermediate": mid, "drafter": "lookup", "min_chain": 2, "max_chain": 4, "lookup_tokens": 3},
        "hier-eagle": {"intermediate": mid, "drafter": "eagle", "head": _random_head(mid), "min_chain": 2,
                       "max_chain": 4, "top_k": 4, "depth": 3, "total_nodes": 10},
    }[name]
    strategy = name.split("-")[0]
    totals = assert_lossless_and_mixed(lambda: make_strategy(strategy, lm, **params), lm, varied_prompts())
    assert len(totals) == (2 if strategy == "hier" else 1)


def _sample_counts(lm, prompt, strategy, params, n_samples, vocab=4, n=3):
    counts = torch.zeros(vocab**n, dtype=torch.float64)
    strat = make_strategy(strategy, lm, **params)
    for seed in range(n_samples):
        sp = SamplingParams(max_tokens=n, temperature=TEMP, seed=seed)
        ids = generate(strat, prompt, sp).token_ids
        counts[sum(t * vocab ** (n - 1 - i) for i, t in enumerate(ids))] += 1
    return counts


def _random_head(lm, seed: int = 0):
    from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig

    torch.manual_seed(seed)
    return EagleHead(HeadConfig.for_target(lm)).eval().requires_grad_(False)


@pytest.mark.parametrize("strategy", ["ar", "draft", "lookup", "eagle", "hier"])
def test_sampling_follows_target_distribution(strategy):
    lm = tiny_model(vocab=4, scale=0.05)
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    params = {}
    tree = {"top_k": 2, "depth": 2, "total_nodes": 4}
    if strategy == "draft":
        params = {"draft": tiny_model(seed=7, vocab=4, scale=0.1), "num_tokens": 2}
    elif strategy == "lookup":
        params = {"num_tokens": 2}
    elif strategy == "eagle":  # a random head: its trees propose real alternatives to be rejected
        params = {"head": _random_head(lm), **tree}
    elif strategy == "hier":  # EAGLE tree -> intermediate (another tiny model) -> target
        mid = tiny_model(seed=7, vocab=4, scale=0.1)
        params = {"intermediate": mid, "drafter": "eagle", "head": _random_head(mid), "min_chain": 2, "max_chain": 3,
                  **tree}
    exact = exact_joint(lm, prompt)
    assert exact.max() < 0.2 and (exact * 1500 >= 5).sum() >= 30  # a real spread, not a near-deterministic model
    counts = _sample_counts(lm, prompt, strategy, params, N_SAMPLES)
    assert chi2_pvalue(counts, exact) > ALPHA


def test_top_p_nucleus_from_the_likeliest_equals_a_full_sort(monkeypatch):
    """top_p's nucleus: the likeliest tokens, equal ones in token order, each kept while the mass before it is at
    most top_p. Found among the likeliest few when the cut falls there, it is bit for bit the full sort's, on a
    Qwen-sized vocabulary with bf16 logits (ties at the cut are common), one row or several."""
    flat = torch.full((4,), 0.25)
    assert sampling.nucleus(flat, 0.5).tolist() == [0.25, 0.25, 0.25, 0.0]
    spiky = torch.cat([torch.full((4,), 0.125), torch.full((2044,), 0.5 / 2044)])  # the 4th has exactly top_p before it
    assert torch.equal(sampling.nucleus(spiky, 0.375), torch.cat([torch.full((4,), 0.125), torch.zeros(2044)]))
    g = torch.Generator().manual_seed(0)
    rows = [torch.softmax((torch.randn(r, 151936, generator=g) * s).bfloat16().float() / 0.8, -1)
            for s, r in ((5, 1), (6, 3), (8, 1), (3, 1))]  # the last: a nucleus wider than the probe
    cuts, probe = {}, sampling.PROBE
    for top_p in (0.5, 0.9, 0.95):
        cuts[top_p] = [sampling.nucleus(p, top_p) for p in rows]
    monkeypatch.setattr(sampling, "PROBE", 151936)  # a full sort for every row
    for top_p, got in cuts.items():
        for p, fast in zip(rows, got):
            assert torch.equal(fast, sampling.nucleus(p, top_p))
    assert (cuts[0.95][0] > 0).sum() < probe < (cuts[0.95][-1] > 0).sum()  # both ways ran


def test_chi_square_rejects_a_wrong_distribution():
    """Negative control: the draft model's own samples are not the target's distribution."""
    lm = tiny_model(vocab=4, scale=0.05)
    other = tiny_model(seed=7, vocab=4, scale=0.1)
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    counts = _sample_counts(other, prompt, "ar", {}, N_SAMPLES)
    assert chi2_pvalue(counts, exact_joint(lm, prompt)) < ALPHA


def first_tokens_of_three_children(p, q, stochastic: bool, n: int, seed: int):
    """Counts of the first emitted token over n verifications of three root children drafted from q (drawn from q
    without replacement, or its deterministic top 3) against a target p."""
    logits = torch.log(p).repeat(4, 1)  # root row + 3 node rows
    sp = SamplingParams(temperature=1.0)
    counts = torch.zeros(len(p), dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        if stochastic:
            qq, kids = q.clone(), []
            for _ in range(3):
                x = int(torch.multinomial(qq / qq.sum(), 1, generator=gen))
                kids.append(x)
                qq[x] = 0
            tree = Tree(kids, [-1, -1, -1], [q, q, q])
        else:  # q = one-hot for each chosen child
            tree = Tree(q.topk(3).indices.tolist(), [-1, -1, -1])
        v = verify(logits, tree, sp, gen)
        counts[tree.tokens[v.path[0]] if v.path else v.bonus] += 1
    return counts


@pytest.mark.parametrize("stochastic", [False, True])
def test_tree_verifier_with_several_children_is_exact(stochastic):
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, generator=g) * 1.5, 0)
    q = torch.softmax(torch.randn(5, generator=g) * 1.5, 0)
    assert chi2_pvalue(first_tokens_of_three_children(p, q, stochastic, 6000, seed=1), p.double()) > ALPHA


@pytest.mark.parametrize("stochastic", [False, True])
def test_sibling_children_see_the_renormalised_residual(stochastic):
    """A draft close to the target (the usual case) accepts often, so the second and third children are reached
    with a residual whose mass is small: unless it is renormalised before the next child's p/q test, the output
    drifts from p. (With q far from p, as above, the first child decides almost every step and hides this.)"""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.tensor([2.0, 1.6, 0.4, -0.5]), 0)
    q = torch.softmax(torch.log(p) + 0.35 * torch.randn(4, generator=g), 0)
    assert chi2_pvalue(first_tokens_of_three_children(p, q, stochastic, 12000, seed=4), p.double()) > ALPHA


def test_greedy_tree_verifier_follows_argmax_path():
    V = 6
    logits = torch.full((5, V), -5.0)
    # root predicts 2; node0 (token 2) predicts 4; node2 (token 4, child of node0) predicts 1
    logits[0, 2] = logits[1, 4] = logits[3, 1] = 5.0
    tree = Tree([2, 3, 4, 5], [-1, -1, 0, 0])
    v = verify(logits, tree, SamplingParams(), None)
    assert v.path == [0, 2] and v.bonus == 1 and v.tokens(tree) == [2, 4, 1]


def test_strategy_parameter_errors():
    lm = tiny_model()
    with pytest.raises(BadInput, match="unknown strategy"):
        make_strategy("medusa", lm)
    with pytest.raises(BadInput, match="num_tokens"):
        make_strategy("lookup", lm, num_tokens=0)
    with pytest.raises(BadInput, match="incompatible tokenizers"):
        make_strategy("draft", lm, draft=tiny_model(vocab=32))
    with pytest.raises(BadInput, match="strategy 'lookup'"):
        make_strategy("lookup", lm, bogus=1)


def test_stop_conditions():
    lm = tiny_model()
    lm.config.eos_ids = []
    r = generate(make_strategy("ar", lm), [1, 2, 3], SamplingParams(max_tokens=7))
    assert len(r.token_ids) == 7 and r.finish_reason == "length" and len(r.token_times) == 7
    eos = r.token_ids[3]
    lm.config.eos_ids = [eos]
    r2 = generate(make_strategy("lookup", lm), [1, 2, 3], SamplingParams(max_tokens=7))
    assert r2.finish_reason == "stop" and eos not in r2.token_ids and r2.token_ids == r.token_ids[: r.token_ids.index(eos)]
    lm.config.eos_ids = []


def test_raising_from_on_tokens_ends_generate_at_that_step():
    """A caller's on_tokens that raises (how a caller cancels) ends the generation at once and reaches the caller;
    the strategy's batch-of-one scheduler is empty again for the next call."""
    from specledger.decoding.loop.generate import solo_scheduler

    class Stop(Exception):
        pass

    st = make_strategy("ar", varied_model())
    seen: list[list[int]] = []

    def on_tokens(new: list[int], _t: float) -> None:
        seen.append(new)
        if len(seen) == 3:
            raise Stop

    with pytest.raises(Stop):
        generate(st, [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True), on_tokens)
    assert len(seen) == 3  # no step ran after the one whose tokens raised
    assert not solo_scheduler(st).has_work()
    assert len(generate(st, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True)).token_ids) == 5

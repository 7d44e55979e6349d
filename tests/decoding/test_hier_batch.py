"""The hierarchy in a continuous batch: ModelDrafter (an intermediate verifying its inner drafter's trees into
chains, for many sequences at once) under the scheduler, at concurrency 1 and 4.

Lossless: greedy, every request's tokens equal autoregressive decoding of it alone while every level's
proposals are accepted sometimes and rejected sometimes (a perturbed copy of the target as intermediate, prompt
lookup or a random EAGLE head below it); a stack of two intermediates too. Sampling: chi-square against the
exact joint distribution, requests sharing the batch. Each level's statistics are reported per request, lowest
first, and agree with one another. The planner's price counts the rounds a chain takes.
"""

from __future__ import annotations

import pytest
import torch
from tests.conftest import TEMP, chi2_pvalue, exact_joint, tiny_model
from tests.support.varied_model import FLAT, alone, random_head, run_all, run_joining, varied_model, varied_prompts

from specledger.decoding.sizing.planner import CostSurface
from specledger.decoding.drafters.base import DraftSeq
from specledger.decoding.factory import make_strategy
from specledger.decoding.drafters.model import ModelDrafter
from specledger.decoding.params import STRATEGIES
from specledger.decoding.sampling import SamplingParams, probs_from_logits
from specledger.decoding.loop.scheduler import Scheduler

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def hier(kind: str, lm):
    mid = varied_model(noise=0.1)  # mostly agrees with the target, as an intermediate should
    chains = {"min_chain": 2, "max_chain": 4}
    if kind == "lookup":
        return make_strategy("hier", lm, intermediate=mid, drafter="lookup", lookup_tokens=3, **chains)
    if kind == "eagle":
        return make_strategy("hier", lm, intermediate=mid, drafter="eagle", head=random_head(mid), top_k=3, depth=3,
                             total_nodes=10, **chains)
    # a stack: lookup -> a closer copy -> the perturbed one -> the target
    return make_strategy("hier", lm, intermediate=[varied_model(noise=0.05), mid], drafter="lookup", lookup_tokens=3,
                         min_chain=[2, 3], max_chain=4)


def check_levels(results, names: list[str], concurrency: int) -> None:
    """Every request reports every level, lowest first; each level's counts are consistent, the last is what the
    target verified, and a level below produced (accepted path + bonus per verification) every token it passed up."""
    for r in results:
        lv = r.levels
        assert [x.name for x in lv] == names
        for x in lv:
            assert 0 <= x.accepted <= x.proposed and sum(x.accepted_per_position) == x.accepted
            assert x.drafts is not None and x.steps is not None and x.drafts <= x.steps
        top = lv[-1]
        assert r.appended == r.steps + top.accepted and top.steps == r.steps
        for below, above in zip(lv, lv[1:]):  # the chains below fed every token proposed above
            assert below.accepted + below.steps >= above.proposed
            assert below.steps >= above.drafts  # every chain took at least one verification below
        assert all(x.time_s is not None and x.time_s >= 0 for x in lv)
        if concurrency == 1:  # the levels' seconds are the request's drafting time (batched, each plan is shared)
            assert sum(x.time_s or 0.0 for x in lv) == pytest.approx(r.draft_s)
    for i, name in enumerate(names):  # over the requests, each level was right sometimes and wrong sometimes
        proposed = sum(r.levels[i].proposed for r in results)
        accepted = sum(r.levels[i].accepted for r in results)
        assert 0 < accepted < proposed, (name, accepted, proposed)


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("kind", ["lookup", "eagle", "stack"])
def test_batched_hierarchy_is_lossless_and_mixed(kind, concurrency):
    lm = varied_model()
    st = hier(kind, lm)
    prompts = varied_prompts(n=5, seed=2)
    max_new = [30, 12, 25, 40, 18]
    drafter = st.batch_drafter(concurrency)
    sched = Scheduler(lm, max_batch=concurrency, prefill_chunk=8, drafter=drafter, cost=FLAT)
    results = run_joining(sched, prompts, max_new)
    for i, p in enumerate(prompts):
        want = alone(lm, p, SamplingParams(max_tokens=max_new[i], temperature=0.0))
        assert results[i].token_ids == want.token_ids, i
        assert results[i].finish_reason == want.finish_reason
    if concurrency > 1:
        assert max(r.mean_batch for r in results.values()) > 1.5  # sequences did share passes
    check_levels(list(results.values()), st.level_names, concurrency)
    assert sched.runner.cache.free_slots == concurrency and drafter.seqs == {}  # every slot given back, each level's
    inner = drafter.inner
    while isinstance(inner, ModelDrafter):
        assert inner.seqs == {} and inner.runner.cache.free_slots == concurrency
        inner = inner.inner


def same_counts(a, b) -> bool:
    return (a.steps, a.drafts, a.proposed, a.accepted, a.accepted_per_position) == (
        b.steps, b.drafts, b.proposed, b.accepted, b.accepted_per_position)


@pytest.mark.parametrize("kind", ["lookup", "eagle"])
def test_batched_rounds_are_each_sequence_alone(kind):
    """Three sequences' chains built together (one pass of the intermediate per round over those still building)
    equal each one's chain built alone, and so do the verdicts on every proposal of the drafter below, step after
    step as the verifier keeps part of each chain: no row, position, mask or cache entry leaks between sequences."""
    lm = varied_model()
    st = hier(kind, lm)
    seqs = [DraftSeq(i, p + [i + 1], SamplingParams()) for i, p in enumerate(varied_prompts(n=3, seed=4))]
    together = st.batch_drafter(3)
    alones = [st.batch_drafter(1) for _ in seqs]
    for s, one in zip(seqs, alones):
        together.begin(s, None)
        one.begin(DraftSeq(0, s.tokens, s.sp), None)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        budgets = [4, 2, 3]
        chains = together.propose(seqs, budgets)
        for s, one, b, chain in zip(seqs, alones, budgets, chains):
            [want] = one.propose([DraftSeq(0, s.tokens, s.sp)], [b])
            assert chain.tokens == want.tokens and chain.is_chain() and 0 < len(chain) <= b
            assert same_counts(together.inner_levels(s.key)[0], one.inner_levels(0)[0])  # the same verdicts below
            # a greedy chain is the intermediate's own greedy continuation, whatever its drafter proposed
            mine = alone(st.mids[0], s.tokens, SamplingParams(max_tokens=len(chain), temperature=0.0,
                                                              ignore_eos=True))
            assert chain.tokens == mine.token_ids
            keep = int(torch.randint(0, len(chain) + 1, (1,), generator=g))  # the verifier keeps a prefix
            s.tokens = s.tokens + chain.tokens[:keep] + [int(torch.randint(0, 16, (1,), generator=g))]
    below = [together.inner_levels(s.key)[0] for s in seqs]
    assert 0 < sum(x.accepted for x in below) < sum(x.proposed for x in below)  # right sometimes, wrong sometimes


def test_batched_hierarchy_sampling_follows_target_distribution():
    """Seeded requests, eight at a time in one batch, each verifying with its own generator at both levels: the
    first three tokens follow the target's exact joint distribution. Five are generated, so that the second and
    third come from one chain of the intermediate (with three, the budget allows one-token chains only)."""
    lm = tiny_model(vocab=4, scale=0.05)
    mid = tiny_model(seed=7, vocab=4, scale=0.1)
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    st = make_strategy("hier", lm, intermediate=mid, drafter="eagle", head=random_head(mid), top_k=2, depth=2,
                       total_nodes=4, min_chain=2, max_chain=3)
    sched = Scheduler(lm, max_batch=8, drafter=st.batch_drafter(8), cost=FLAT)
    n_samples, vocab, n = 1500, 4, 3
    for seed in range(n_samples):
        sched.add(prompt, SamplingParams(max_tokens=n + 2, temperature=TEMP, seed=seed, ignore_eos=True))
    counts = torch.zeros(vocab**n, dtype=torch.float64)
    results = run_all(sched)
    assert len(results) == n_samples and max(r.mean_batch for r in results) > 4
    assert any(len(r.levels[-1].accepted_per_position) >= 2 for r in results)  # chains of 2 kept whole
    for r in results:
        counts[sum(t * vocab ** (n - 1 - i) for i, t in enumerate(r.token_ids[:n]))] += 1
    for level in range(2):
        proposed = sum(r.levels[level].proposed for r in results)
        assert 0 < sum(r.levels[level].accepted for r in results) < proposed
    assert chi2_pvalue(counts, exact_joint(lm, prompt)) > 1e-3


@torch.inference_mode()
def test_each_chain_token_carries_the_intermediates_distribution():
    """Sampling: every chain token's q is the intermediate's distribution at its position given the chain before
    it (what the target's verification divides by), across rounds and as the verifier keeps part of each chain."""
    lm = varied_model()
    st = hier("eagle", lm)
    mid = st.mids[0]
    sp = SamplingParams(temperature=0.9, top_p=0.95)
    d = st.batch_drafter(2)
    seqs = [DraftSeq(i, p, sp, torch.Generator().manual_seed(i)) for i, p in enumerate(varied_prompts(n=2, seed=5))]
    for s in seqs:
        d.begin(s, None)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        for s, chain in zip(seqs, d.propose(seqs, [4, 3])):
            assert chain.q is not None and len(chain.q) == len(chain) > 0
            for j, q in enumerate(chain.q):
                ctx = s.tokens + chain.tokens[:j]
                logits = mid.model(torch.tensor([ctx]), mid.model.new_cache(len(ctx)))[0, -1]
                torch.testing.assert_close(q, probs_from_logits(logits, sp), rtol=1e-4, atol=1e-5)
            keep = int(torch.randint(0, len(chain) + 1, (1,), generator=g))  # the verifier keeps a prefix
            s.tokens = s.tokens + chain.tokens[:keep] + [int(torch.randint(0, 16, (1,), generator=g))]
            d.accept(s, None)


def test_hierarchy_price_counts_its_rounds_and_catch_up():
    """A chain of min(min_chain, budget) tokens takes about that many over the measured tokens per round; each
    round is a pass of the intermediate over the sequences still building (their pending token and proposal),
    the first also a lazy prompt's catch-up, spread over the tokens left like a draft model's."""
    lm = varied_model()
    drafter = make_strategy("hier", lm, intermediate=varied_model(noise=0.1), drafter="lookup", lookup_tokens=3,
                            min_chain=4, max_chain=6).batch_drafter(2)
    drafter._surface = CostSurface((1, 64), (1.0, 64.0))  # a row costs 1 s: the price counts rows
    drafter.per_round = 2.0
    p = varied_prompts(n=1, length=5)[0] + [3, 3, 3]  # 13 tokens: 12 to feed behind the pending one
    seq = DraftSeq(0, p, SamplingParams())
    drafter.begin(seq, None)
    [k] = drafter.candidates([seq], [5])
    [ki] = drafter._inner_k  # what lookup finds to propose a round
    assert k == 5 and ki <= 3
    # two rounds (4 tokens at 2 a round); the first also feeds 7 (a chain's worth) + 5 spread over 5/7 steps
    assert drafter.draft_cost([5]) == pytest.approx((1 + ki + 7 + 5) + (1 + ki))
    assert drafter.draft_cost([1]) == pytest.approx(1 + min(ki, 1) + 7 + 5)  # one token: one round
    assert drafter.draft_cost([0]) == 0
    drafter.candidates([seq], [19])
    assert drafter.draft_cost([5]) == pytest.approx((1 + ki + 7 + 5 / (19 / 7)) + (1 + ki))
    drafter.propose([seq], [5])
    drafter.candidates([seq], [20])
    drafter.per_round = 2.0
    [ki] = drafter._inner_k
    assert drafter.draft_cost([5]) == pytest.approx(2 * (1 + ki))  # fed: a pending row and a proposal per round


def test_hier_is_batched_with_its_levels_named():
    assert "hier" in STRATEGIES
    lm = varied_model()
    d = hier("stack", lm).batch_drafter(4)
    assert d.name == "mid1:varied0~0.1:fp32" and d.level_names == ["lookup", "mid0:varied0~0.05:fp32"]
    assert d.prior is None  # no tokenizer: the agreement is not measured
    assert [x.name for x in d.inner_levels(None)] == d.level_names


@pytest.mark.slow
def test_embedded_hierarchy_batched_equals_alone(smollm, smollm_int4):
    """On the embedded model (its W4A16 copy as intermediate, prompt lookup below), three requests in one batch
    each get autoregressive decoding's tokens, and the intermediate's chains are accepted by the target."""
    texts = ["Explain why the sky is blue in two sentences.", "Write a Python function that checks for primes.",
             "Translate into French: The library opens at eight in the morning."]
    ps = [smollm.tokenizer.chat([{"role": "user", "content": t}]) for t in texts]
    sps = [SamplingParams(max_tokens=k) for k in (16, 10, 20)]
    st = make_strategy("hier", smollm, intermediate=smollm_int4, drafter="lookup", min_chain=3, max_chain=6)
    sched = Scheduler(smollm, max_batch=3, prefill_chunk=64, drafter=st.batch_drafter(3), cost=FLAT)
    rids = [sched.add(p, sp) for p, sp in zip(ps, sps)]
    got = {r.request_id: r for r in run_all(sched)}
    for rid, p, sp in zip(rids, ps, sps):
        assert got[rid].token_ids == alone(smollm, p, sp).token_ids
    top = [got[rid].levels[-1] for rid in rids]
    assert [x.name for x in got[rids[0]].levels] == st.level_names
    assert sum(x.accepted for x in top) > 0 and max(r.mean_batch for r in got.values()) > 1.5


@pytest.mark.parametrize("strategy", ["hier", "draft"])
def test_a_self_draft_takes_the_prompt_from_its_verifier(strategy):
    """An intermediate (or draft model) of the target's own weights at another precision begins with the prompt's
    entries copied from the target's slot, in its own slot for that request (no prefill of its own); one of other
    weights, or with share_prompt_kv off, has nothing cached until its first proposal feeds the prompt. Lossless
    either way: every request equals autoregressive decoding alone, the copy's drafts accepted sometimes and
    rejected sometimes."""
    lm = varied_model()
    prompts = varied_prompts(n=3, seed=4)
    max_new = [20, 14, 24]
    cases = {"copy": (varied_model(quant="int4"), True), "off": (varied_model(quant="int4"), False),
             "other weights": (varied_model(noise=0.1), True)}
    for case, (mid, share) in cases.items():
        role = {"intermediate": mid, "drafter": "lookup", "lookup_tokens": 3, "min_chain": 2, "max_chain": 4} \
            if strategy == "hier" else {"draft": mid, "num_tokens": 3}
        st = make_strategy(strategy, lm, share_prompt_kv=share, **role)
        assert st.params()["share_prompt_kv"] is share
        drafter = st.batch_drafter(2)
        sched = Scheduler(lm, max_batch=2, prefill_chunk=64, drafter=drafter, cost=FLAT)
        rids = [sched.add(p, SamplingParams(max_tokens=n, temperature=0.0)) for p, n in zip(prompts[:2], max_new)]
        sched.step()  # both prompts prefilled in one pass and their first tokens drawn: the drafter has begun
        for rid, p in zip(rids, prompts):
            m = drafter.seqs[rid].mseq
            slot = next(lv.running_seq.slot for lv in sched._running if lv.rid == rid)
            taken = case == "copy"
            assert drafter.runner.cached(m) == (len(p) if taken else 0), case
            if taken:
                mine, theirs = drafter.runner.cache, sched.runner.cache
                assert torch.equal(mine.k[:, m.slot, :, :len(p)], theirs.k[:, slot, :, :len(p)].to(mine.k.dtype))
                assert torch.equal(mine.v[:, m.slot, :, :len(p)], theirs.v[:, slot, :, :len(p)].to(mine.v.dtype))
        sched.add(prompts[2], SamplingParams(max_tokens=max_new[2], temperature=0.0))
        results = {r.request_id: r for r in run_all(sched)}
        for i, p in enumerate(prompts):
            want = alone(lm, p, SamplingParams(max_tokens=max_new[i], temperature=0.0))
            assert results[i].token_ids == want.token_ids, (case, i)
        top = [r.levels[-1] for r in results.values()]
        assert 0 < sum(x.accepted for x in top) < sum(x.proposed for x in top), case

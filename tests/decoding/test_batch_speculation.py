"""Batched speculation (prompt lookup) with the draft length planned per sequence per step.

Lossless: greedy fp32, several sequences of different lengths joining and leaving, every
request's tokens equal generate() with `ar` alone, while drafts are really accepted and
rejected (repetitive prompts, so lookup hits). The planner: drafts freely when a pass costs
the same for any rows, never when every row costs its full share, and turns down as the
batch fills on a surface in between.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tests.support.varied_model import BATCHING_VOCAB, FLAT, alone, batching_model, run_all, run_joining

from specledger.decoding.sizing.planner import (
    PRIOR,
    AcceptanceEMA,
    CostSurface,
    FittedSurface,
    gain_calibration,
    measure_cost_surface,
    pass_calibration,
    plan_drafts,
    RankAcceptance,
    StepOverhead,
)
from specledger.decoding.sizing.policy import EVIDENCE
from specledger.decoding.drafters.lookup import LookupDrafter
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import Scheduler

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def plan_chains(available: list[int], accept: list[float], base_rows: int, base_tokens: int, cost) -> list[int]:
    """plan_drafts for chains whose tokens are each accepted with probability a (AcceptanceEMA's gains)."""
    return plan_drafts([AcceptanceEMA(a).gains(n) for n, a in zip(available, accept)], base_rows, base_tokens, cost)


def drafted_per_plan(sched: Scheduler) -> list[int]:
    """Draft tokens of each of the scheduler's plans from now on (the step's own last while its pass runs)."""
    assert sched.spec is not None
    out: list[int] = []
    plan = sched.spec.plan

    def spy(*args):
        trees = plan(*args)
        out.append(sum(len(t) for t in trees))
        return trees

    sched.spec.plan = spy  # type: ignore[method-assign]
    return out


def repetitive_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for n, rep in [(5, 4), (3, 7), (9, 2), (4, 3), (2, 10), (1, 1)]:
        out.append(torch.randint(0, BATCHING_VOCAB, (n,), generator=g).tolist() * rep)
    return out


@pytest.mark.parametrize("cost", ["flat", "measured"])
def test_lookup_in_a_batch_is_lossless_and_drafts_are_accepted_and_rejected(lm, cost):
    prompts = repetitive_prompts()
    max_new = [30, 12, 25, 40, 7, 20]
    surface = FLAT if cost == "flat" else measure_cost_surface(lm, n_seqs=3, sizes=(1, 2, 4, 8, 16), reps=1)
    sched = Scheduler(lm, max_batch=3, prefill_chunk=16, drafter=LookupDrafter(8), cost=surface)
    results = run_joining(sched, prompts, max_new)
    for i, p in enumerate(prompts):
        want = alone(lm, p, SamplingParams(max_tokens=max_new[i], temperature=0.0))
        assert results[i].token_ids == want.token_ids, i
        assert results[i].finish_reason == want.finish_reason
    if cost == "flat":
        levels = [r.levels[0] for r in results.values()]
        assert {lv.name for lv in levels} == {"lookup"}
        proposed, accepted = sum(lv.proposed for lv in levels), sum(lv.accepted for lv in levels)
        assert accepted > 0 and proposed > accepted  # some drafts accepted, some rejected
        for r in results.values():  # tau: tokens per target step, the bonus token included
            assert r.steps == r.levels[0].steps and r.appended == r.steps + r.levels[0].accepted
        assert max(r.tau for r in results.values()) > 1.2
        assert all(r.strategy == "lookup" and r.params["draft_length"] == "adaptive" for r in results.values())


def test_lookup_batch_never_drafts_when_every_row_costs_its_share(lm):
    """T(rows) = rows: a drafted token never beats the pass's own rate, so no draft, and AR's tokens."""
    prompts = repetitive_prompts()[:3]
    sched = Scheduler(lm, max_batch=3, drafter=LookupDrafter(8), cost=lambda n: float(n))
    for p in prompts:
        sched.add(p, SamplingParams(max_tokens=15, temperature=0.0))
    results = run_all(sched)
    assert all(r.levels[0].proposed == 0 and r.tau == 1.0 for r in results)


def test_planner_turns_speculation_down_as_the_batch_fills():
    # a pass that costs little more for a few extra rows, then grows with every row (compute-bound)
    surface = CostSurface((1, 4, 8, 16, 32, 64), (1.0, 1.05, 1.2, 2.0, 4.0, 8.0))
    drafted = []
    for b in (1, 2, 4, 8, 16):
        ks = plan_chains([8] * b, [0.8] * b, b, b, surface)
        drafted.append(sum(ks) / b)
    assert drafted[0] >= 3 and drafted[-1] == 0
    assert drafted == sorted(drafted, reverse=True)


def test_planner_prefers_the_sequences_likely_to_be_accepted():
    ks = plan_chains([6, 6, 6], [0.9, 0.2, 0.0], 3, 3, CostSurface((3, 6, 12), (1.0, 1.02, 1.5)))
    assert ks[0] > ks[1] and ks[2] == 0
    assert plan_chains([5, 0], [0.9, 0.9], 2, 2, FLAT) == [5, 0]  # never more than was proposed


@pytest.mark.parametrize("surface", [
    CostSurface((1, 2, 3, 5, 9), (1.0, 1.1, 1.25, 1.6, 2.6)),
    CostSurface((1, 2, 5, 9), (1.0, 1.8, 1.9, 3.5)),  # a jump from 1 to 2 rows (as on a CPU), then flat
])
def test_planner_stops_where_the_expected_rate_peaks(surface):
    """Against brute force over chain lengths for one sequence."""
    for a in (0.3, 0.6, 0.7, 0.9):
        [k] = plan_chains([8], [a], 1, 1, surface)
        best = max(range(9), key=lambda j: (1 + sum(a**i for i in range(1, j + 1))) / surface(1 + j))
        assert k == best, a


def test_planner_looks_past_a_bump_in_the_surface():
    """One token does not pay for the 1 -> 2 row jump, four do: draft four, not none."""
    assert plan_chains([8], [0.7], 1, 1, CostSurface((1, 2, 5, 9), (1.0, 1.8, 1.9, 3.5))) == [4]


def test_planner_charges_each_sequence_that_drafts():
    """What a drafting sequence adds outside the pass (verifying, accepting) is paid once per sequence drafting."""
    gains = [[0.9, 0.8], [0.9, 0.8]]
    assert plan_drafts(gains, 2, 2, FLAT) == [2, 2]
    assert plan_drafts(gains, 2, 2, FLAT, per_drafting=0.4) == [2, 2]  # (2 + 3.4) / 1.8 beats 2 / 1
    assert plan_drafts(gains, 2, 2, FLAT, per_drafting=5.0) == [0, 0]  # no draft pays for its sequence's share
    # a weak sequence's token pays for its row but not for its sequence's share: (2 + 2.7) / 1.5 > (2 + 3.0) / 2
    assert plan_drafts([[0.9, 0.9, 0.9], [0.3]], 2, 2, FLAT) == [3, 1]
    assert plan_drafts([[0.9, 0.9, 0.9], [0.3]], 2, 2, FLAT, per_drafting=0.5) == [3, 0]


def exhaustive_plan(gains, base_rows, base_tokens, cost, draft_cost=None, per_drafting=0.0):
    """plan_drafts without its early stop: every prefix of the nodes by gain is looked at."""
    order = sorted(((g, i) for i, gs in enumerate(gains) for g in gs if g > 0), key=lambda x: -x[0])
    best, best_rate, ks = 0, base_tokens / cost(base_rows), [0] * len(gains)
    for m, (_, i) in enumerate(order, start=1):
        ks[i] += 1
        spent = cost(base_rows + m) + (draft_cost(ks) if draft_cost else 0.0) + per_drafting * sum(k > 0 for k in ks)
        if (base_tokens + sum(g for g, _ in order[:m])) / spent > best_rate:
            best, best_rate = m, (base_tokens + sum(g for g, _ in order[:m])) / spent
    out = [0] * len(gains)
    for _, i in order[:best]:
        out[i] += 1
    return out


def test_planner_early_stop_changes_no_plan():
    """Random batches, acceptances and surfaces (bumps included): the plan equals the exhaustive one."""
    rng = torch.Generator().manual_seed(3)
    for _ in range(300):
        n = int(torch.randint(1, 9, (1,), generator=rng))
        gains = [RankAcceptance(a=float(torch.rand(1, generator=rng))).gains(int(torch.randint(0, 12, (1,), generator=rng)))
                 for _ in range(n)]
        steps = torch.rand(6, generator=rng).tolist()
        cost = CostSurface((1, 2, 4, 8, 16, 128), tuple(0.2 + sum(steps[: j + 1]) for j in range(6)))
        per = float(torch.rand(1, generator=rng)) * 0.3
        fixed = float(torch.rand(1, generator=rng)) * 0.5
        def draft_cost(ks, fixed=fixed):
            return fixed * any(ks) + 0.05 * sum(k > 0 for k in ks)
        assert plan_drafts(gains, n, n, cost, draft_cost, per) == exhaustive_plan(gains, n, n, cost, draft_cost, per)


def test_planner_caps_the_sequences_that_draft():
    """max_drafting: the best nodes of the first sequences only; the others' are passed over, not cut short."""
    gains = [[0.9, 0.8], [0.95, 0.5], [0.7]]
    assert plan_drafts(gains, 3, 3, FLAT) == [2, 2, 1]
    assert plan_drafts(gains, 3, 3, FLAT, max_drafting=1) == [0, 2, 0]
    assert plan_drafts(gains, 3, 3, FLAT, max_drafting=2) == [2, 2, 0]


def test_one_sequence_tries_the_drafter_until_its_acceptance_is_known(lm):
    """From the prior, and again once the estimate has drifted back toward it, one sequence a pass drafts, and
    none beside a joining prompt's chunk; with enough verified nodes behind the estimate, several do."""
    sched = Scheduler(lm, max_batch=3, prefill_chunk=8, drafter=LookupDrafter(4), cost=FLAT)
    spec = sched.spec
    assert spec is not None
    drafting = []
    real_plan = spec.plan

    def plan(states, caps, prefill_rows):
        trees = real_plan(states, caps, prefill_rows)
        drafting.append((sum(1 for t in trees if len(t)), spec.policy.evidence, prefill_rows))
        return trees

    spec.plan = plan
    for p in repetitive_prompts()[:5]:  # prompts over several 8-row chunks; the last two join mid-run
        sched.add(p, SamplingParams(max_tokens=20, temperature=0.0))
    run_all(sched)
    early = [(n, chunk) for n, evidence, chunk in drafting if evidence < EVIDENCE]
    assert all(n <= (0 if chunk else 1) for n, chunk in early) and any(chunk for _, chunk in early)
    assert max(n for n, *_ in drafting) > 1
    assert any(n and chunk for n, _, chunk in drafting)  # once known, a draft may go beside a chunk


def test_planner_weighs_a_draft_beside_a_prefill_chunk_against_the_decode_rate():
    """A joining prompt's 300 rows make the pass slow, not its decode tokens cheap: a draft that does not pay
    in a decode pass does not pay beside the chunk either; one that pays still does (its rows' marginal cost)."""
    linear = CostSurface((1, 1000), (1.0, 1000.0))  # every row costs as much as a one-row pass
    weak = [[0.5]] * 4
    assert plan_drafts(weak, 4, 4, linear) == [0, 0, 0, 0]
    assert plan_drafts(weak, 4, 4, linear, beside=300) == [0, 0, 0, 0]
    knee = CostSurface((1, 8, 16, 1000), (1.0, 1.05, 1.6, 70.0))  # rows cheap up to 8, then ~0.07 each
    strong = [[0.9, 0.8]] * 4
    assert plan_drafts(strong, 4, 4, knee) == [2, 2, 2, 2]
    assert plan_drafts(strong, 4, 4, knee, beside=300) == [2, 2, 2, 2]  # (4 + 6.8) / (1.02 + 8 * 0.07) > 4 / 1.02


def test_step_overhead_is_what_drafting_sequences_add():
    o = StepOverhead(weight=0.5)
    o.observe(0.030, 3, 2)  # nothing known yet of a plain sequence's share: nothing learnt
    assert o.base is None and o.extra == 0.0
    o.observe(0.008, 8, 0)
    assert o.base == pytest.approx(0.001)
    for _ in range(20):
        o.observe(0.008 + 3 * 0.002, 8, 3)
    assert o.extra == pytest.approx(0.002, rel=1e-3) and o.base == pytest.approx(0.001)
    o.observe(0.001, 8, 3)  # noise below the base: never a negative cost
    assert o.extra >= 0.0


def test_the_scheduler_measures_the_step_overhead_of_drafting_passes(lm):
    """Every pass without prefill reports its decoding and drafting sequences; passes with prefill none."""
    seen = []

    class Recorder(StepOverhead):
        def observe(self, seconds, n_seqs, n_drafting):
            seen.append((seconds, n_seqs, n_drafting, sched.last_batch, drafted[-1], sched.last_rows))
            super().observe(seconds, n_seqs, n_drafting)

    sched = Scheduler(lm, max_batch=3, prefill_chunk=8, drafter=LookupDrafter(4), cost=FLAT)  # prompts over passes
    assert sched.spec is not None
    sched.spec.policy.overhead = Recorder()
    drafted = drafted_per_plan(sched)
    for p in repetitive_prompts()[:5]:  # the last two join while the first decode
        sched.add(p, SamplingParams(max_tokens=12, temperature=0.0))
    run_all(sched)
    assert seen and any(d for _, _, d, *_ in seen) and any(not d for _, _, d, *_ in seen)
    for seconds, n, d, batch, drafted, rows in seen:
        assert seconds > 0 and n == batch and 0 <= d <= min(n, drafted) and rows == n + drafted  # no prefill rows
    assert sched.spec.policy.overhead.base is not None


def test_fitted_surface_prices_rows_at_the_measured_ratio():
    """Passes measured 1.5x the probe at 16 rows: 16 rows, and the rows a draft would add above them (never
    seen), cost 1.5x; a knot seen at its probed cost keeps it; the result never decreases in rows."""
    fit = FittedSurface(CostSurface((1, 8, 16, 32), (1.0, 8.0, 16.0, 32.0)))
    for _ in range(3):
        fit.observe(16, 24.0)
    assert fit(16) == pytest.approx(24.0) and fit(32) == pytest.approx(48.0) and fit(24) == pytest.approx(36.0)
    assert fit(1) == pytest.approx(1.5)  # the nearest seen ratio
    fit.observe(1, 1.0)
    assert fit(1) == pytest.approx(1.0) and fit(16) == pytest.approx(24.0)
    fit.observe(12, 6.0)  # between knots: both move, the nearer (and equal-distance) ones by their share
    assert fit(8) < 8 * 1.5 and fit(16) < 24.0
    xs = [fit(n) for n in range(1, 40)]
    assert xs == sorted(xs)
    fit.observe(16, 1e6)  # one stalled pass moves the price by a bounded step
    assert fit(16) < 24.0 * 1.5


def test_the_scheduler_fits_its_measured_surface_to_decode_passes(lm):
    """With no cost given, the planner's surface is the probe's, corrected by the decode passes the batch runs
    (passes carrying prefill rows are not decode passes and feed nothing); a given cost is used as it is."""
    sched = Scheduler(lm, max_batch=3, prefill_chunk=8, drafter=LookupDrafter(4))
    assert sched.spec is not None and isinstance(sched.spec.policy.fit, FittedSurface) and sched.spec.policy.cost is sched.spec.policy.fit
    seen = []
    observe = sched.spec.policy.fit.observe
    drafted = drafted_per_plan(sched)
    sched.spec.policy.fit.observe = lambda rows, s: seen.append((rows, sched.last_batch, drafted[-1])) or observe(rows, s)
    for p in repetitive_prompts()[:5]:
        sched.add(p, SamplingParams(max_tokens=12, temperature=0.0))
    run_all(sched)
    assert seen and all(rows == batch + drafted for rows, batch, drafted in seen)
    assert any(q is not None for q in sched.spec.policy.fit.ratio)
    given = Scheduler(lm, max_batch=3, drafter=LookupDrafter(4), cost=FLAT)
    assert given.spec is not None and given.spec.policy.fit is None and given.spec.policy.cost is FLAT


def test_acceptance_estimate_moves_with_outcomes():
    acc = AcceptanceEMA(a=0.5)
    acc.update(4, [0, 1, 2, 3])
    high = acc.a
    assert high > 0.5
    acc.update(4, [])
    assert acc.a < high


def test_cost_surface_interpolates_and_never_decreases():
    s = CostSurface((1, 4, 8), (1.0, 0.9, 2.0))  # noise made 4 rows look cheaper than 1
    assert s(4) == 1.0 and s(6) == pytest.approx(1.5) and s(12) == pytest.approx(3.0)
    assert s(1) <= s(2) <= s(4) <= s(8)


class WrongDrafter(LookupDrafter):
    """Proposes tokens the target will almost never pick, so its acceptance estimate should fall."""

    def _chain(self, seq, budget: int) -> list[int]:
        return [(seq.tokens[-1] + 1) % BATCHING_VOCAB] * min(4, budget)


def test_a_sequence_whose_drafts_fail_stops_drafting(lm):
    """Drafting pays here only while a > 0.3; from a = 0.6, rejections bring it below within a few steps."""
    surface = CostSurface((1, 2, 3, 9), (1.0, 1.3, 1.6, 3.4))
    sched = Scheduler(lm, max_batch=1, drafter=WrongDrafter(4), cost=surface)
    sched.add(repetitive_prompts()[0], SamplingParams(max_tokens=40, temperature=0.0))
    [r] = run_all(sched)
    lv = r.levels[0]
    assert 0 < lv.proposed <= 10 and lv.steps >= 30
    assert r.token_ids == alone(lm, repetitive_prompts()[0], SamplingParams(max_tokens=40, temperature=0.0)).token_ids


def test_a_new_request_starts_from_what_the_drafters_recent_requests_accepted(lm):
    """The second request does not spend its first passes unlearning the default prior: it starts from the
    acceptance the first one's failed drafts left, and so drafts no more than the first did."""
    surface = CostSurface((1, 2, 3, 9), (1.0, 1.3, 1.6, 3.4))
    sched = Scheduler(lm, max_batch=1, drafter=WrongDrafter(4), cost=surface)
    sp = SamplingParams(max_tokens=40, temperature=0.0)
    sched.add(repetitive_prompts()[0], sp)
    [r] = run_all(sched)
    first = r.levels[0].proposed
    assert sched.spec is not None and first > 0
    learnt = sched.spec.policy.population.a
    assert learnt < PRIOR
    sched.add(repetitive_prompts()[0], sp)
    sched.step()  # the prompt's pass: its first token, and its drafting state begun
    [live] = sched._running
    assert live.draft is not None and sched.spec.policy.acc[live.rid].a == pytest.approx(learnt)
    [r] = run_all(sched)
    assert r.levels[0].proposed <= first
    # passes that draft nothing (here every row costs its share) teach nothing: the estimate drifts back up
    low = sched.spec.policy.population.a
    sched.spec.policy.cost = lambda n: float(n)
    sched.add(repetitive_prompts()[1], sp)
    [r] = run_all(sched)
    assert r.levels[0].proposed == 0 and low < sched.spec.policy.population.a < PRIOR


def test_acceptance_estimates_drift_back_to_the_prior_without_evidence():
    chain, tree = AcceptanceEMA(a=0.1), RankAcceptance(a=0.1)
    tree.update(2, [])
    chain.relax(0.5)
    tree.relax(0.5)
    assert chain.a == pytest.approx(0.35)
    assert tree.hits[0] == pytest.approx((0.1 * 0.5 + PRIOR) / 2)  # the first tree weighs as much as the prior
    assert tree.hits[1] == pytest.approx((0.01 * 0.5 + PRIOR**2) / 2)


def test_inprocess_backend_batches_lookup_with_the_same_tokens_and_reports_acceptance(tmp_path):
    """Concurrency 3: batched adaptive lookup (the default for lookup) gives the serial lookup's tokens
    (both equal autoregressive, greedy) and records per-request proposals and acceptances."""
    import json

    from tests.support.varied_model import CharTokenizer

    from specledger.bench.backends.inprocess import InProcessBackend
    from specledger.records.config import parse_run_config
    from specledger.records.results import read_requests
    from specledger.bench.runner import Runner as BenchRunner

    lm = batching_model(tokenizer=CharTokenizer())
    wl = tmp_path / "w.jsonl"
    turns = ["abcabcabcabc", "the cat the cat the cat", "xyzxyz xyzxyz", "q q q q q q"]
    wl.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                          for i, t in enumerate(turns)))
    cfg = parse_run_config({
        "configs": [{"name": "batched", "strategy": "lookup", "max_tokens": 16, "max_batch": 3},
                    {"name": "serial", "strategy": "lookup", "max_tokens": 16, "batching": False}],
        "workload": {"spec": str(wl)}, "load": {"concurrency": [3], "warmup": 0}, "bootstrap": 20,
    })
    assert cfg.configs[0].batch_size == 3 and cfg.configs[1].batch_size == 1
    BenchRunner(cfg, tmp_path / "run", show_progress=False,
                backend_factory=lambda bc: InProcessBackend(bc, models={"target": lm})).run()
    recs = read_requests(tmp_path / "run")
    by = {(r.config, r.question_id): r for r in recs}
    assert len(by) == 8 and all(r.status == "ok" for r in recs)
    for q in range(len(turns)):
        assert by[("batched", str(q))].output_token_ids == by[("serial", str(q))].output_token_ids
    levels = [lv for r in recs if r.config == "batched" for lv in r.levels]
    assert levels and {lv.name for lv in levels} == {"lookup"}


def test_cost_surface_is_measured_once_per_model_and_again_only_when_larger(lm):
    from specledger.decoding.sizing.planner import cost_surface

    first = cost_surface(lm, max_rows=8, n_seqs=2, reps=1)
    assert first.rows[-1] == 8 and cost_surface(lm, max_rows=4, n_seqs=2, reps=1) is first
    bigger = cost_surface(lm, max_rows=20, n_seqs=2, reps=1)
    assert bigger is not first and bigger.rows[-1] == 32
    assert all(t > 0 for t in bigger.seconds)


def test_sampled_lookup_in_a_batch_is_reproducible_per_seed(lm):
    """Temperature > 0: each request keeps its own generator, so a seed gives the same tokens whatever
    else is in the batch (here: alone vs with two others, same fixed cost surface, the drafter's acceptance
    known: while it is not, only one sequence a pass drafts, and which one depends on the batch)."""
    prompts = repetitive_prompts()[:3]
    sp = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=7)

    def run(ps):
        sched = Scheduler(lm, max_batch=3, drafter=LookupDrafter(4), cost=FLAT)
        assert sched.spec is not None
        sched.spec.policy.evidence = 1e9
        ids = [sched.add(p, sp) for p in ps]
        got = {r.request_id: r for r in run_all(sched)}
        return [got[i] for i in ids]

    together = run(prompts)
    alone_first = run(prompts[:1])[0]
    assert together[0].token_ids == alone_first.token_ids and len(alone_first.token_ids) == 20
    assert sum(r.levels[0].proposed for r in together) > 0


def test_the_first_verified_trees_outweigh_the_prior():
    """Three rejected trees leave a quarter of the prior (each observation so far weighs as much as the prior),
    not 61% of it as a plain 0.15 EMA would; from then on the EMA's own weight."""
    tree, chain = RankAcceptance(), AcceptanceEMA()
    for _ in range(3):
        tree.update(1, [])
        chain.update(1, [])
    assert tree.hits[0] == pytest.approx(PRIOR / 4) and chain.a == pytest.approx(PRIOR / 4)
    for _ in range(20):
        chain.update(1, [0])
    before = chain.a
    chain.update(1, [])
    assert chain.a == pytest.approx(before * 0.85)


def test_gain_calibration_scales_the_gains_by_what_was_accepted():
    cal = gain_calibration()
    assert cal.factor == 1.0 and cal.scaled([0.9, 0.5]) == [0.9, 0.5]
    for _ in range(200):  # plans that expected 3 tokens a tree got 1
        cal.observe(3.0, 1)
    assert cal.factor == pytest.approx(1 / 3, rel=0.02)
    assert cal.scaled([0.9, 0.3]) == pytest.approx([0.3, 0.1], rel=0.02)
    for _ in range(200):  # estimates too low: scaled up, but never past certainty
        cal.observe(1.0, 2)
    assert cal.factor == 1.25 and cal.scaled([0.9, 0.4]) == [1.0, 0.5]


def test_the_planner_drafts_by_the_calibrated_gains(lm):
    """The same request and drafter: a batch whose past drafts were accepted a quarter as often as expected
    drafts less than a fresh one (drafting here pays only while a token's chance is above ~0.3)."""
    def burn(spec):
        for _ in range(300):
            spec.policy.calibration.observe(4.0, 1)

    fresh, burnt = proposed_fresh_and_burnt(lm, burn)
    assert fresh > 0 and burnt < fresh


def proposed_fresh_and_burnt(lm, burn) -> tuple[int, int]:
    """Draft tokens proposed for one repetitive request by a fresh batch and by one whose planner state burn()
    has spoilt, on a fixed cost surface."""
    surface = CostSurface((1, 2, 3, 9), (1.0, 1.3, 1.6, 3.4))
    sp = SamplingParams(max_tokens=30, temperature=0.0)
    proposed = []
    for burnt in (False, True):
        sched = Scheduler(lm, max_batch=1, drafter=LookupDrafter(4), cost=surface)
        assert sched.spec is not None
        if burnt:
            burn(sched.spec)
        sched.add(repetitive_prompts()[4], sp)
        [r] = run_all(sched)
        proposed.append(r.levels[0].proposed)
    return proposed[0], proposed[1]


def test_pass_calibration_is_what_drafting_added_over_what_was_predicted():
    cal = pass_calibration()
    assert cal.factor == 1.0
    for _ in range(60):  # passes priced at 10 ms over a plain pass took 40 ms over it
        cal.observe(0.010, 0.040)
    assert cal.factor == pytest.approx(4.0, rel=0.02)
    for _ in range(60):  # drafting cheaper than predicted; a noisy pass below the plain one counts as free
        cal.observe(0.010, 0.006)
        cal.observe(0.010, -0.004)
    assert cal.factor == pytest.approx(0.5) and replace(pass_calibration(), measured=1.0).factor == 4.0
    cal.observe(0.0, 1.0)  # nothing predicted: nothing to compare
    assert cal.factor == pytest.approx(0.5)


def test_the_planner_pays_drafting_at_its_measured_price():
    """price multiplies the seconds drafted rows add (their share of the pass, each drafting sequence), not the pass."""
    gains = [[0.9, 0.8, 0.5], [0.9, 0.4]]
    surface = CostSurface((1, 2, 8), (1.0, 1.0, 1.6))  # 0.1 a row from 2 rows on
    assert plan_drafts(gains, 2, 2, surface) == [3, 2]
    assert plan_drafts(gains, 2, 2, surface, price=2.0) == [2, 1]  # 4.6 / 1.6 beats 5.5 / 2.0
    assert plan_drafts(gains, 2, 2, surface, price=4.0) == [1, 1]
    assert plan_drafts(gains, 2, 2, surface, price=8.0) == [0, 0]
    assert plan_drafts(gains, 2, 2, surface, per_drafting=0.5, price=4.0) == [0, 0]
    assert plan_drafts(gains, 2, 2, surface, per_drafting=0.5) == [3, 2]


def test_the_scheduler_prices_drafting_at_what_its_drafting_passes_took(lm):
    """Each drafting pass without prefill compares what its plan predicted drafting adds with the step's time over
    a plain pass of its sequences; a batch whose drafts cost 4x their price drafts less than a fresh one."""
    sp = SamplingParams(max_tokens=30, temperature=0.0)
    sched = Scheduler(lm, max_batch=2, prefill_chunk=64, drafter=LookupDrafter(4))
    assert sched.spec is not None
    seen = []
    observe = sched.spec.policy.pass_price.observe
    drafted = drafted_per_plan(sched)
    sched.spec.policy.pass_price.observe = lambda pred, meas: seen.append((pred, meas, drafted[-1])) or observe(pred, meas)
    for p in repetitive_prompts()[:3]:
        sched.add(p, sp)
    run_all(sched)
    assert seen and all(pred > 0 and drafted > 0 for pred, _, drafted in seen)

    def burn(spec):
        for _ in range(100):
            spec.policy.pass_price.observe(1.0, 4.0)

    fresh, burnt = proposed_fresh_and_burnt(lm, burn)
    assert fresh > 0 and burnt < fresh


def test_the_probed_surface_reaches_a_whole_proposal_beside_the_batch(lm):
    """A batch of 2 whose drafter proposes up to 20 nodes has its surface probed past 22 rows, not only 4 a sequence."""
    sched = Scheduler(lm, max_batch=2, drafter=LookupDrafter(20))
    assert sched.spec is not None and sched.spec.policy.fit is not None and sched.spec.policy.fit.prior.rows[-1] >= 22


def test_a_drafter_with_a_measured_prior_is_tried_where_the_default_prior_is_not(lm):
    """The population (and every new request) starts from drafter.prior and drifts back to it, not to PRIOR: on a
    surface where a 0.6 chain never pays, a drafter that measured 0.95 drafts at batch 1."""
    surface = CostSurface((1, 2, 5, 9), (1.0, 1.7, 2.6, 3.5))
    sp = SamplingParams(max_tokens=30, temperature=0.0)
    proposed = []
    for prior in (None, 0.95):
        d = LookupDrafter(4)
        d.prior = prior  # type: ignore[assignment]  # (lookup measures none: as if it had)
        sched = Scheduler(lm, max_batch=1, drafter=d, cost=surface)
        assert sched.spec is not None
        pop = sched.spec.policy.population
        assert isinstance(pop, AcceptanceEMA) and pop.a == pytest.approx(prior or PRIOR)
        pop.relax(0.5)
        assert pop.a == pytest.approx(prior or PRIOR)
        sched.add(repetitive_prompts()[4], sp)
        [r] = run_all(sched)
        proposed.append(r.levels[0].proposed)
    assert proposed[0] == 0 and proposed[1] > 0

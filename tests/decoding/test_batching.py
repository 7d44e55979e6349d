"""Continuous batching is lossless: every request's tokens in a batch equal the same request run alone.

The model here is this file's own: small, random weights, UNTIED embeddings (a tied random
model tends to echo its input), so greedy outputs vary and a mixed-up row, position or
cache slot shows. Requests differ in prompt length and max tokens and join and leave
mid-run; prefill is chunked so prompts are fed across several passes.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tests.support.varied_model import BATCHING_VOCAB, CharTokenizer, alone, batching_model, run_all

from specledger.decoding.loop.runner import RunItem, ModelRunner, common_prefix
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import Scheduler
from specledger.decoding.tree import Tree
from specledger.engine.model import new_slot_cache, ragged_hidden
from specledger.engine.ragged import Segment
from specledger.engine.slot_cache import SlotCache
from specledger.errors import BadInput

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 41, 1, 17, 29, 8, 60, 5][:n]
    return [torch.randint(0, BATCHING_VOCAB, (k,), generator=g).tolist() for k in lengths]


# ---- the slot cache -------------------------------------------------------------------------------


def test_slot_cache_rollback_compaction_and_growth_stay_in_their_slot():
    c = SlotCache(1, 1, 2, n_slots=3, max_len=64, initial_len=4)
    a, b = c.alloc(), c.alloc()
    assert (a, b) == (0, 1) and c.free_slots == 1
    c.write(0, a, 0, torch.arange(8.0).view(1, 4, 2), torch.zeros(1, 4, 2))
    c.lengths[a] = 4
    c.write(0, b, 0, torch.full((1, 3, 2), -1.0), torch.zeros(1, 3, 2))
    c.lengths[b] = 3
    c.reserve(9)  # grows: contents kept
    assert c.capacity >= 9 and c.k[0, a, 0, :4].flatten().tolist() == list(range(8))
    c.keep(a, 1, [1, 3])  # compact entries 1 and 3 to 1, 2 in slot a only
    assert c.lengths[a] == 3 and c.k[0, a, 0, :3, 0].tolist() == [0.0, 2.0, 6.0]
    assert c.lengths[b] == 3 and c.k[0, b, 0, :3].eq(-1).all()
    c.rollback(b, 1)
    assert c.lengths == [3, 1, 0]
    with pytest.raises(ValueError):
        c.rollback(b, 2)
    c.release(a)
    assert c.alloc() == 0 and c.lengths[0] == 0
    with pytest.raises(BadInput):
        c.reserve(65)


# ---- one ragged pass ------------------------------------------------------------------------------


def test_common_prefix_counts_shared_leading_tokens_up_to_the_limit():
    """What a slot keeps on sync and an EAGLE head keeps on accept: whole when one sequence extends the other."""
    assert common_prefix([1, 2, 3], [1, 2, 3, 4], 10) == 3
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4], 3) == 3
    assert common_prefix([1, 2, 5, 4], [1, 2, 3, 4], 10) == 2
    assert common_prefix([], [1], 5) == 0 and common_prefix([7], [8], 5) == 0


def test_ragged_pass_equals_each_sequence_run_alone(lm):
    """Decode rows, a prefill chunk and a tree, in one pass, each against its own slot."""
    m = lm.model
    seqs = prompts(3, seed=1)
    cache = new_slot_cache(m, 4)
    slots = [cache.alloc() for _ in seqs]
    slots = [slots[2], slots[0], slots[1]]  # slot order differs from row order
    # prefill each sequence but its last 1, 5 and 0 tokens (ragged lengths)
    held = [1, 5, 0]  # (the third, one token long, has no prefill: its root is its only token)
    for s, seq, k in zip(slots, seqs, held):
        n = len(seq) - k - (1 if k == 0 else 0)
        if n:
            ragged_hidden(m, torch.tensor(seq[:n]), torch.arange(n), [Segment(s, n)], cache)
    tree = Tree(tokens=[5, 6, 8, 2], parents=[-1, -1, 0, 1])
    from specledger.decoding.loop.runner import tree_rows

    start2 = len(seqs[2]) - 1
    p2, m2 = tree_rows(start2, 1, tree, "cpu")
    toks = seqs[0][-1:] + seqs[1][-5:] + seqs[2][-1:] + tree.tokens
    pos = torch.cat([torch.tensor([len(seqs[0]) - 1]), torch.arange(len(seqs[1]) - 5, len(seqs[1])), p2])
    h = ragged_hidden(m, torch.tensor(toks), pos, [Segment(slots[0], 1), Segment(slots[1], 5),
                                                   Segment(slots[2], 1 + len(tree), m2)], cache)
    logits = m.logits(h)

    def ref(ids):
        return m(torch.tensor([ids]), m.new_cache(128))[0]

    torch.testing.assert_close(logits[0], ref(seqs[0])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1:6], ref(seqs[1])[-5:], atol=1e-4, rtol=1e-4)
    for node, path in {-1: [], 2: [5, 8], 3: [6, 2]}.items():
        torch.testing.assert_close(logits[7 + node], ref(seqs[2] + path)[-1], atol=1e-4, rtol=1e-4)
    assert [cache.lengths[s] for s in slots] == [len(seqs[0]), len(seqs[1]), len(seqs[2]) + len(tree)]


def test_decode_rows_attend_together_beside_segments_attending_alone(lm):
    """Two decode rows attend in one batched call (with slots in their range that are not in the pass) while a
    drafted chain, a tree and a prefill chunk attend one by one, the chunk's rows first; every row as if alone."""
    from specledger.decoding.loop.runner import tree_rows

    m = lm.model
    seqs = prompts(7, seed=3)  # lengths 3, 41, 1, 17, 29, 8, 60
    held = {0: 1, 3: 1, 4: 3, 5: 1, 6: 20}  # sequence -> tokens left for the pass
    cache = new_slot_cache(m, 8)
    slots = {i: cache.alloc() for i in range(7)}  # slots 1 and 2 stay out of the pass
    for i, k in held.items():
        n = len(seqs[i]) - k
        ragged_hidden(m, torch.tensor(seqs[i][:n]), torch.arange(n), [Segment(slots[i], n)], cache)
    tree = Tree(tokens=[5, 6, 8], parents=[-1, -1, 0])
    start5 = len(seqs[5]) - 1
    p5, m5 = tree_rows(start5, 1, tree, "cpu")
    order = [6, 0, 4, 5, 3]  # the decode rows are not the pass's first rows
    toks, pos, segs = [], [], []
    for i in order:
        k = held[i]
        toks += seqs[i][-k:] + (tree.tokens if i == 5 else [])
        pos.append(p5 if i == 5 else torch.arange(len(seqs[i]) - k, len(seqs[i])))
        segs.append(Segment(slots[i], k + len(tree), m5) if i == 5 else Segment(slots[i], k))
    h = ragged_hidden(m, torch.tensor(toks), torch.cat(pos), segs, cache)
    logits = m.logits(h)

    def ref(ids):
        return m(torch.tensor([ids]), m.new_cache(128))[0]

    row = 0
    for i in order:
        k = held[i]
        if i == 5:
            for node, path in {-1: [], 0: [5], 1: [6], 2: [5, 8]}.items():
                torch.testing.assert_close(logits[row + 1 + node], ref(seqs[5] + path)[-1], atol=1e-4, rtol=1e-4)
            row += k + len(tree)
        else:
            torch.testing.assert_close(logits[row : row + k], ref(seqs[i])[-k:], atol=1e-4, rtol=1e-4)
            row += k
    assert [cache.lengths[slots[i]] for i in order] == [len(seqs[i]) + (len(tree) if i == 5 else 0) for i in order]
    assert cache.lengths[slots[1]] == cache.lengths[slots[2]] == 0


@pytest.mark.parametrize("dtype,quant,tol", [("fp32", "none", 1e-4), ("bf16", "none", 0.1), ("bf16", "int4", 0.1)])
def test_batched_decode_pass_equals_single_decode(dtype, quant, tol):
    """Every sequence adds one token (the one-call attention over padded slots), slots not contiguous;
    in 16-bit and W4A16 too (against the single-sequence path at the same precision)."""
    m = batching_model(dtype=dtype, quant=quant).model
    seqs = prompts(4, seed=2)
    cache = new_slot_cache(m, 6)
    slots = [cache.alloc() for _ in range(6)]
    used = [slots[5], slots[1], slots[3], slots[0]]
    for s, seq in zip(used, seqs):
        n = len(seq) - 1
        if n:
            ragged_hidden(m, torch.tensor(seq[:n]), torch.arange(n), [Segment(s, n)], cache)
    h = ragged_hidden(m, torch.tensor([q[-1] for q in seqs]), torch.tensor([len(q) - 1 for q in seqs]),
                      [Segment(s, 1) for s in used], cache)
    for row, seq in enumerate(seqs):
        ref = m(torch.tensor([seq]), m.new_cache(128))[0, -1]
        torch.testing.assert_close(m.logits(h[row]), ref, atol=tol, rtol=tol)


def test_batch_runner_verifies_every_sequence_draft_like_runner(lm):
    """The batched verification API: per sequence a chain, a tree or nothing; logits and accepted cache as alone."""
    seqs = prompts(3, seed=3)
    drafts = [Tree.chain([4, 9, 1]), Tree(tokens=[5, 6, 8], parents=[-1, -1, 0]), Tree()]
    br = ModelRunner(lm, 3)
    opened = [br.open(s) for s in seqs]
    first = br.forward([RunItem(q) for q in opened])
    assert all(f.logits.shape[0] == 1 for f in first)
    for q, f in zip(opened, first):
        br.accept(q, f, [], [int(f.logits[0].argmax())])
    fwds = br.forward([RunItem(q, t) for q, t in zip(opened, drafts)])
    paths = [[0, 1], [1], []]
    m = lm.model

    def tokens_to(t: Tree, i: int) -> list[int]:
        out = []
        while i >= 0:
            out.append(t.tokens[i])
            i = t.parents[i]
        return out[::-1]

    for q, t, f, path in zip(opened, drafts, fwds, paths):
        # at the root and at every node: the logits of the sequence followed by that node's path, run alone
        ends = [[]] + [tokens_to(t, i) for i in range(len(t))]
        ref = torch.stack([m(torch.tensor([q.tokens + e]), m.new_cache(128))[0, -1] for e in ends])
        torch.testing.assert_close(f.logits, ref, atol=1e-4, rtol=1e-4)
        new = [t.tokens[i] for i in path] + [7]
        br.accept(q, f, path, new)
    nxt = br.forward([RunItem(q) for q in opened])
    for q, f in zip(opened, nxt):
        ref = lm.model(torch.tensor([q.tokens]), lm.model.new_cache(128))[0, -1]
        torch.testing.assert_close(f.logits[0], ref, atol=1e-4, rtol=1e-4)


def test_decode_steps_take_logits_and_features_without_a_gather(lm):
    """A pass of decode steps only needs every row's logits: the LM head runs on the pass's rows as they are, and
    accepting a plain step hands back its features uncopied; a pass with a prompt still takes its last row only."""
    br = ModelRunner(lm, 3)
    a, c, b = (br.open(s) for s in prompts(3, seed=5))  # c: 41 tokens
    for q, f in zip((a, b), br.forward([RunItem(a), RunItem(b)])):
        br.accept(q, f, [], [int(f.logits[0].argmax())])
    fwds = br.forward([RunItem(a), RunItem(b)])
    for q, f in zip((a, b), fwds):
        torch.testing.assert_close(f.logits, lm.model.logits(f.hidden))
        feats = br.accept(q, f, [], [int(f.logits[0].argmax())])
        assert feats.data_ptr() == f.hidden.data_ptr() and br.cached(q) == len(q.tokens) - 1
    mixed = br.forward([RunItem(c), RunItem(a)])  # c's whole prompt, then a's decode row
    assert [f.logits.shape[0] for f in mixed] == [1, 1]
    torch.testing.assert_close(mixed[0].logits, lm.model.logits(mixed[0].hidden[-1:]))
    torch.testing.assert_close(mixed[1].logits, lm.model.logits(mixed[1].hidden))


# ---- the scheduler --------------------------------------------------------------------------------


def _distinct(ids):
    return len(set(ids))


def test_greedy_batch_equals_each_request_alone_with_joins_and_leaves(lm):
    ps = prompts(8)
    maxes = [24, 9, 30, 3, 17, 12, 20, 1]
    sps = [SamplingParams(max_tokens=k) for k in maxes]
    refs = [alone(lm, p, sp).token_ids for p, sp in zip(ps, sps)]
    assert sum(_distinct(r) for r in refs) > 40  # the model's greedy outputs vary
    s = Scheduler(lm, max_batch=4, prefill_chunk=7)
    ids = [s.add(p, sp) for p, sp in zip(ps[:5], sps[:5])]
    got = {}
    for _ in range(6):  # the first requests run, some finish ...
        got |= {r.request_id: r for r in s.step()}
    ids += [s.add(p, sp) for p, sp in zip(ps[5:], sps[5:])]  # ... and others join mid-run
    batches, rows = set(), set()
    while s.has_work():
        got |= {r.request_id: r for r in s.step()}
        batches.add(s.last_batch)
        rows.add(s.last_rows)
    assert max(batches) == 4 and min(batches) < 4  # the batch filled and drained
    assert 7 < max(rows) <= 7 + 3  # prefill chunks of at most 7 rows share passes with decoding rows
    for rid, ref, k in zip(ids, refs, maxes):
        assert got[rid].token_ids == ref, rid
        assert got[rid].finish_reason == "length" and len(got[rid].token_ids) == k
    assert s.runner.cache.free_slots == 4


def test_prefix_cache_reuses_earlier_requests_and_stays_lossless(lm):
    """The next turn of a conversation, a prompt that leaves an earlier one mid-way, the same prompt again: each
    prefills only what no free slot holds, and its tokens are those it gets alone."""
    g = torch.Generator().manual_seed(11)
    p1 = torch.randint(0, BATCHING_VOCAB, (30,), generator=g).tolist()
    other = torch.randint(0, BATCHING_VOCAB, (25,), generator=g).tolist()
    sp = SamplingParams(max_tokens=12)
    s = Scheduler(lm, max_batch=2, prefill_chunk=64)

    def run(prompt: list[int]):
        s.add(prompt, sp)
        (r,) = run_all(s)
        assert r.token_ids == alone(lm, prompt, sp).token_ids
        return r

    r1 = run(p1)
    assert r1.cached_tokens == 0
    assert run(other).cached_tokens == 0  # shares nothing: takes the other slot, p1's stays cached
    p2 = p1 + r1.token_ids + [5, 6, 7]  # the next turn: everything but r1's last token is cached
    r2 = run(p2)
    assert r2.cached_tokens == len(p1) + len(r1.token_ids) - 1
    p3 = p2[:20] + [(t + 1) % BATCHING_VOCAB for t in p2[20:40]]  # leaves p2 at token 20
    assert run(p3).cached_tokens == 20
    assert run(other).cached_tokens == len(other) - 1  # the same prompt again: its last token is fed
    # without the prefix cache nothing is reused
    s = Scheduler(lm, max_batch=2, prefill_chunk=64, prefix_cache=False)
    for p in (p1, p1):
        s.add(p, sp)
        assert run_all(s)[0].cached_tokens == 0


def test_prompts_sharing_only_a_template_keep_each_others_entries(lm):
    """Distinct prompts with a few shared opening tokens (a chat template) take the slot freed longest ago, not the
    one holding another prompt, so each stays cached for its next time (as llama-server's slots do)."""
    g = torch.Generator().manual_seed(12)
    head = torch.randint(0, BATCHING_VOCAB, (5,), generator=g).tolist()
    prompts = [head + torch.randint(0, BATCHING_VOCAB, (25,), generator=g).tolist() for _ in range(3)]
    sp = SamplingParams(max_tokens=4)
    s = Scheduler(lm, max_batch=3, prefill_chunk=64)
    cached = []
    for p in prompts + prompts:
        s.add(p, sp)
        (r,) = run_all(s)
        assert r.token_ids == alone(lm, p, sp).token_ids
        cached.append(r.cached_tokens)
    assert cached == [0, 0, 0] + [len(p) - 1 for p in prompts]


def test_prompts_outnumbering_the_slots_come_back_from_host_memory(lm):
    """Four prompts in turn through two slots, then again (a benchmark's second load level re-asking its first's
    prompts): each slot's entries are parked in host memory before a new prompt overwrites them, and come back
    instead of a prefill; the tokens are those each prompt gets alone. Without room to park (park_bytes 0), or
    with room for one, fewer come back."""
    g = torch.Generator().manual_seed(13)
    ps = [torch.randint(0, BATCHING_VOCAB, (30,), generator=g).tolist() for _ in range(4)]
    sp = SamplingParams(max_tokens=6)

    def rounds(park_bytes: int | None, again: list[list[int]]) -> tuple[list[int], int]:
        s = Scheduler(lm, max_batch=2, prefill_chunk=64)
        if park_bytes is not None:
            s.runner.park_bytes = park_bytes
        cached = []
        for p in ps + again:
            s.add(p, sp)
            (r,) = run_all(s)
            assert r.token_ids == alone(lm, p, sp).token_ids, (park_bytes, r.finish_reason, r.error)
            cached.append(r.cached_tokens)
        return cached, s.runner.restored

    assert rounds(None, ps) == ([0] * 4 + [29] * 4, 4)
    assert rounds(0, ps) == ([0] * 8, 0)
    k = ModelRunner(lm, 1).cache.k
    one = 50 * k[:, 0, :, :1].numel() * k.element_size() * 2  # room for one prompt's 35 entries, not two
    # ps[0] was parked first and dropped when ps[1] was parked: ps[1] comes back, ps[0] is prefilled again
    assert rounds(one, [ps[1], ps[0]]) == ([0] * 4 + [29, 0], 1)


def test_a_parked_prefix_serves_like_a_fresh_prefill_features_included(lm):
    runner, fresh = ModelRunner(lm, 1, prefix_cache=True, keep_features=True), ModelRunner(lm, 1)
    a, other = prompts(2)[1], prompts(7)[6]
    for p in (a, other):  # `other` takes the only slot: a's entries are parked
        seq = runner.open(p)
        runner.forward([RunItem(seq)])
        runner.close(seq)
    b = a[:35] + [1, 2, 3]
    seq = runner.open(b)
    assert seq.reused == 35 and runner.restored == 1
    got = runner.forward([RunItem(seq)], all_logits=True)[0]
    f = fresh.open(b)
    want = fresh.forward([RunItem(f)], all_logits=True)[0]
    assert got.logits is not None and want.logits is not None and want.hidden is not None
    torch.testing.assert_close(got.logits, want.logits[35:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(runner.features(seq), want.hidden, rtol=1e-4, atol=1e-4)


def test_prefix_cache_entries_serve_like_a_fresh_prefill(lm):
    runner, fresh = ModelRunner(lm, 1, prefix_cache=True), ModelRunner(lm, 1)
    a = prompts(2)[1]
    seq = runner.open(a)
    runner.forward([RunItem(seq)])
    runner.close(seq)
    b = a[:30] + [(t + 1) % BATCHING_VOCAB for t in a[30:]] + [1, 2, 3]
    seq = runner.open(b)
    assert seq.reused == 30
    got = runner.forward([RunItem(seq)], all_logits=True)[0].logits
    f = fresh.open(b)
    want = fresh.forward([RunItem(f)], all_logits=True)[0].logits
    assert got is not None and want is not None
    torch.testing.assert_close(got, want[30:], rtol=1e-4, atol=1e-4)


def test_runner_features_of_a_reused_prefix_equal_a_fresh_prefills(lm):
    """keep_features: the slot's features cover every cached token, those of a kept prefix and a tree's accepted
    path included, and equal the features a prefill of the same tokens computes."""
    runner, fresh = ModelRunner(lm, 1, prefix_cache=True, keep_features=True), ModelRunner(lm, 1)
    a = prompts(2)[1]
    seq = runner.open(a)
    runner.forward([RunItem(seq, max_run=16)])
    runner.forward([RunItem(seq)])
    seq.tokens.append(7)
    tree = Tree([5, 9, 2, 8], [-1, -1, 0, 2])
    fwd = runner.forward([RunItem(seq, tree)])[0]
    runner.accept(seq, fwd, [1], [9, 4])  # the second root, then a bonus token
    runner.close(seq)
    b = seq.tokens + [1, 2, 3]
    seq = runner.open(b)
    assert seq.reused == len(a) + 2
    runner.forward([RunItem(seq)])
    f = fresh.open(b)
    want = fresh.forward([RunItem(f)])[0].hidden
    torch.testing.assert_close(runner.features(seq), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="keeps no features"):
        fresh.features(f)


def test_prefix_cache_forgets_a_slot_a_failed_pass_may_have_spoilt(lm):
    runner = ModelRunner(lm, 2, prefix_cache=True)
    toks = prompts(1)[0] * 3
    seq = runner.open(toks)
    runner.forward([RunItem(seq)])
    runner.close(seq, keep=False)
    assert runner.open(toks).reused == 0
    seq = runner.open(toks)  # the other slot
    runner.forward([RunItem(seq)])
    runner.close(seq)
    assert runner.open(toks).reused == len(toks) - 1


def test_seeded_sampling_in_a_batch_equals_alone(lm):
    ps = prompts(5, seed=4)
    sps = [SamplingParams(max_tokens=n, temperature=t, top_k=k, top_p=tp, seed=seed)
           for n, t, k, tp, seed in [(15, 0.9, 0, 1.0, 1), (11, 1.3, 20, 1.0, 2), (19, 0.7, 0, 0.9, 3),
                                     (8, 0.0, 0, 1.0, 0), (13, 1.0, 0, 1.0, 1)]]
    refs = [alone(lm, p, sp).token_ids for p, sp in zip(ps, sps)]
    s = Scheduler(lm, max_batch=3, prefill_chunk=16)
    ids = [s.add(p, sp) for p, sp in zip(ps, sps)]
    got = {r.request_id: r.token_ids for r in run_all(s)}
    assert [got[i] for i in ids] == refs
    # a different seed gives a different sequence (the seed is really per request)
    s.add(ps[0], SamplingParams(max_tokens=15, temperature=0.9, seed=99))
    assert run_all(s)[0].token_ids != refs[0]


def test_stops_in_a_batch_follow_generate():
    """eos after min tokens, and stop strings, cut each request exactly where generate() does."""
    lm = batching_model(tokenizer=CharTokenizer())
    ps = prompts(4, seed=5)
    base = [alone(lm, p, SamplingParams(max_tokens=30)).token_ids for p in ps]
    eos = base[0][5]
    lm_eos = batching_model(eos=[eos], tokenizer=CharTokenizer())
    text = CharTokenizer().decode(base[2])
    ps[1] = ps[0]  # eos first allowed exactly where it appears: min_tokens=5
    sps = [SamplingParams(max_tokens=30), SamplingParams(max_tokens=30, min_tokens=5),
           SamplingParams(max_tokens=30, stop=[text[6:8]], ignore_eos=True),  # the stop string, not eos, ends it
           SamplingParams(max_tokens=30, ignore_eos=True)]
    refs = [alone(lm_eos, p, sp) for p, sp in zip(ps, sps)]
    assert refs[0].finish_reason == "stop" and len(refs[0].token_ids) <= 5
    assert refs[1].finish_reason == "stop" and len(refs[1].token_ids) == 5
    assert refs[2].finish_reason == "stop" and refs[2].text == text[:6]
    s = Scheduler(lm_eos, max_batch=4, prefill_chunk=8)
    ids = [s.add(p, sp) for p, sp in zip(ps, sps)]
    got = {r.request_id: r for r in run_all(s)}
    for rid, ref in zip(ids, refs):
        assert (got[rid].token_ids, got[rid].text, got[rid].finish_reason) == (ref.token_ids, ref.text,
                                                                                ref.finish_reason)
        assert len(got[rid].token_times) == len(got[rid].token_ids)
    cut = got[ids[2]]
    assert cut.text == text[:6] and len(cut.token_ids) < len(base[2]) and text[6:8] not in cut.text


def test_cancel_frees_the_slot_and_leaves_the_others_untouched(lm):
    ps = prompts(3, seed=6)
    sps = [SamplingParams(max_tokens=20)] * 3
    refs = [alone(lm, p, sp).token_ids for p, sp in zip(ps, sps)]
    streamed: list[int] = []
    s = Scheduler(lm, max_batch=2, prefill_chunk=64)
    a = s.add(ps[0], sps[0], on_tokens=lambda ids, t: streamed.extend(ids))
    b = s.add(ps[1], sps[1])
    c = s.add(ps[2], sps[2])  # waits: the batch is full
    done = {}
    for _ in range(4):
        done |= {r.request_id: r for r in s.step()}
    s.cancel(a)
    done |= {r.request_id: r for r in run_all(s)}
    assert done[a].finish_reason == "cancelled" and 0 < len(done[a].token_ids) < 20
    assert done[a].token_ids == refs[0][: len(done[a].token_ids)] == streamed
    assert done[b].token_ids == refs[1] and done[c].token_ids == refs[2]
    assert done[c].queue_s > 0 and done[c].ttft_s >= done[c].queue_s + done[c].prefill_s - 1e-9
    times = done[b].token_times
    assert times == sorted(times) and done[b].ttft_s > 0 and done[b].steps == 19
    assert s.runner.cache.free_slots == 2


def test_scheduler_rejects_bad_requests(lm):
    s = Scheduler(lm, max_batch=2)
    with pytest.raises(BadInput, match="empty prompt"):
        s.add([], SamplingParams())
    with pytest.raises(BadInput, match="does not fit the context"):
        s.add([1] * 256, SamplingParams())
    with pytest.raises(BadInput, match="max_batch"):
        Scheduler(lm, max_batch=0)


def test_worker_thread_serves_futures_and_survives_a_failed_pass(lm):
    from specledger.decoding.loop.worker import SchedulerThread

    ps = prompts(3, seed=7)
    sp = SamplingParams(max_tokens=6)
    refs = [alone(lm, p, sp).token_ids for p in ps]
    sched = Scheduler(lm, max_batch=2)
    worker = SchedulerThread(sched)
    try:
        futs = [worker.submit(p, sp)[1] for p in ps]
        assert [f.result(timeout=60).token_ids for f in futs] == refs
        real = sched.runner.forward
        sched.runner.forward = lambda items: (_ for _ in ()).throw(RuntimeError("boom"))
        failed = worker.submit(ps[0], sp)[1].result(timeout=60)
        assert failed.finish_reason == "error" and failed.error == "RuntimeError: boom"
        sched.runner.forward = real
        assert worker.submit(ps[1], sp)[1].result(timeout=60).token_ids == refs[1]
        assert sched.runner.cache.free_slots == 2
    finally:
        worker.close()


def test_inprocess_backend_batches_ar_concurrency(tmp_path):
    """Concurrency 4 on the in-process backend: 4 sequences at once for "ar" (requests overlap in time),
    the same tokens as the one-at-a-time path (batching: false), which never overlaps."""
    import json

    from specledger.bench.backends.inprocess import InProcessBackend
    from specledger.records.config import parse_run_config
    from specledger.records.results import read_requests
    from specledger.bench.runner import Runner as BenchRunner

    lm = batching_model(tokenizer=CharTokenizer())
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n" for i, t in
                          enumerate(["abc", "a longer question here", "xyz xyz", "q", "what now?"])))
    cfg = parse_run_config({
        "configs": [{"name": "batched", "strategy": "ar", "max_tokens": 10, "max_batch": 4, "prefill_chunk": 5},
                    {"name": "serial", "strategy": "ar", "max_tokens": 10, "batching": False}],
        "workload": {"spec": str(wl)}, "load": {"concurrency": [4], "warmup": 0}, "bootstrap": 20,
    })
    from specledger.decoding.loop import scheduler

    chunks = []

    class Recording(scheduler.Scheduler):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            chunks.append((self.max_batch, self.prefill_chunk))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler, "Scheduler", Recording)
        BenchRunner(cfg, tmp_path / "run", show_progress=False,
                    backend_factory=lambda bc: InProcessBackend(bc, models={"target": lm})).run()
    # the configuration's prefill chunk reaches the scheduler; `batching: false` is a scheduler of one
    assert chunks == [(4, 5), (1, 256)]
    recs = read_requests(tmp_path / "run")
    by = {(r.config, r.question_id): r for r in recs}
    assert len(by) == 10 and all(r.status == "ok" for r in recs)
    for q in range(5):
        assert by[("batched", str(q))].output_token_ids == by[("serial", str(q))].output_token_ids

    def overlaps(name):
        rs = sorted((r for r in recs if r.config == name), key=lambda r: r.start_t)
        return any(b.start_t < a.end_t for a, b in itertools.pairwise(rs))

    assert overlaps("batched") and not overlaps("serial")
    hier = parse_run_config({"configs": [{"name": "h", "strategy": "hier",  # batched by default, as the others
                                          "intermediate": {"model": "smollm2-135m", "dtype": "bf16"}}],
                             "workload": {"spec": str(wl)}})
    assert hier.configs[0].batch_size > 1


@pytest.mark.slow
def test_embedded_model_batch_equals_alone(smollm):
    texts = ["Explain why the sky is blue in two sentences.", "Write a Python function that checks for primes.",
             "Translate into French: The library opens at eight in the morning."]
    ps = [smollm.tokenizer.chat([{"role": "user", "content": t}]) for t in texts]
    sps = [SamplingParams(max_tokens=k) for k in (8, 5, 10)]
    refs = [alone(smollm, p, sp).token_ids for p, sp in zip(ps, sps)]
    s = Scheduler(smollm, max_batch=3, prefill_chunk=24)
    ids = [s.add(p, sp) for p, sp in zip(ps, sps)]
    got = {r.request_id: r.token_ids for r in run_all(s)}
    assert [got[i] for i in ids] == refs

"""EAGLE head, EAGLE-2 tree drafting and the EagleTree strategy."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import PROMPTS, tiny_model
from tests.support.varied_model import assert_lossless_and_mixed, prompt_features, varied_model, varied_prompts
from specledger.decoding.autoregressive import Autoregressive
from specledger.decoding.drafters.eagle import EagleDrafter, EagleTree
from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig, load_head, save_head, shipped_head_dir
from specledger.decoding.loop.generate import generate
from specledger.decoding.drafters.base import DraftSeq
from specledger.engine.ragged import Segment
from specledger.decoding.sampling import SamplingParams
from specledger.errors import BadInput


def random_head(lm, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(lm))
    with torch.no_grad():  # norms away from 1 so that a mix-up of weights shows
        for name, p in head.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return head.eval().requires_grad_(False)


def head_rows(head, lm, tokens, feats):
    """The head fed one sequence's entries (n,) tokens + (n, H) features on a fresh cache: predicted features."""
    cache = head.new_slot_cache(1, 8)
    return head.ragged(lm.model, tokens, feats, torch.arange(len(tokens)), [Segment(cache.alloc(), len(tokens))], cache)


class One:
    """An EagleDrafter following one sequence through the drafter lifecycle, as these tests drive it."""

    def __init__(self, *args, **kw) -> None:
        self.d = EagleDrafter(*args, **kw)
        self.seq = DraftSeq(0, [], SamplingParams())

    def start(self, tokens, feats):
        self.seq.tokens = list(tokens)
        self.d.begin(self.seq, feats)

    def draft(self, budget):
        return self.d.propose([self.seq], [budget])[0]

    def observe(self, tokens, feats):
        self.seq.tokens = list(tokens)
        self.d.accept(self.seq, feats)

    @property
    def st(self):
        return self.d.seqs[0]

    def record_logp(self) -> list[float]:
        """From now on, the head's log-probability of every candidate given its parent, in creation order (with one
        sequence drafting, its candidates are the rows of each level's top-k, in order)."""
        logp: list[float] = []
        top = self.d._top

        def spy(h, k):
            v, ids = top(h, k)
            logp.extend(v.reshape(-1).tolist())
            return v, ids

        self.d._top = spy
        return logp

    @property
    def length(self):
        return self.d.cache.lengths[self.st.slot]


def test_tree_invariants_on_tiny():
    lm = tiny_model()
    head = random_head(lm)
    prompt = [1, 5, 9, 2, 7, 3]
    feats = prompt_features(lm, prompt)
    seq = prompt + [4]
    for top_k, depth, total, budget in [(10, 5, 59, 100), (4, 3, 20, 7), (3, 6, 256, 300), (1, 4, 10, 10), (5, 1, 3, 10)]:
        d = One(head, lm, top_k=top_k, depth=depth, max_nodes=total, max_len=200)
        d.start(seq, feats)
        tree = d.draft(budget)
        n_cand = top_k + (depth - 1) * top_k * top_k
        assert len(tree) == min(total, budget, n_cand)
        assert all(p < i for i, p in enumerate(tree.parents))
        assert max(tree.depths()) <= depth
        for kids in tree.children():  # siblings are distinct tokens
            toks = [tree.tokens[c] for c in kids]
            assert len(toks) == len(set(toks)) and len(kids) <= top_k
        assert d.length == len(seq) - 1  # tree entries rolled back
        assert d.draft(budget).tokens == tree.tokens  # deterministic
        d.d.explore = True  # expanding every level (no early stop) keeps exactly the same tree
        full = d.draft(budget)
        assert (full.tokens, full.parents) == (tree.tokens, tree.parents)
        d.d.explore = False
    assert len(d.draft(0)) == 0


def test_best_nodes_are_kept():
    """The kept nodes are the best-scoring candidates: every dropped one scores no higher."""
    lm = tiny_model(vocab=48)
    head = random_head(lm, 3)
    feats = prompt_features(lm, [3, 4, 5])
    d = One(head, lm, top_k=4, depth=3, max_nodes=12, max_len=200)
    d.start([3, 4, 5, 6], feats)
    logp = d.record_logp()
    tree = d.draft(100)
    st = d.st
    assert len(logp) == len(st.cand_tokens) and len(tree) == 12
    cum = [0.0] * len(st.cand_tokens)
    for c, p in enumerate(st.cand_parents):
        cum[c] = logp[c] + (cum[p] if p >= 0 else 0.0)
    kept: list[int] = []  # each tree node's candidate: its parent's child with its token (siblings are distinct)
    for tok, p in zip(tree.tokens, tree.parents):
        parent = kept[p] if p >= 0 else -1
        kept.append(next(c for c, q in enumerate(st.cand_parents) if q == parent and st.cand_tokens[c] == tok))
    assert [cum[c] for c in kept] == sorted((cum[c] for c in kept), reverse=True)  # best first
    worst_kept = min(cum[c] for c in kept)
    assert all(cum[c] <= worst_kept + 1e-6 for c in range(len(cum)) if c not in kept)


def test_tree_drafting_equals_each_path_run_alone():
    """Every candidate's log-probability is what the head gives when its path alone is fed causally: the tree
    mask lets a node see exactly its ancestors (not its siblings, not other branches) at the right positions."""
    lm = tiny_model()
    head = random_head(lm, 5)
    prompt = [4, 9, 2, 7, 7, 1]
    feats = prompt_features(lm, prompt)
    d = One(head, lm, top_k=3, depth=4, max_nodes=40, max_len=100)
    d.start(prompt + [3], feats)
    d.d.explore = True
    logp = d.record_logp()
    d.draft(40)
    st, cache, committed = d.st, d.d.cache, d.length
    assert len(logp) == len(st.cand_tokens)

    def path_to(c):
        out = []
        while c >= 0:
            out.append(c)
            c = st.cand_parents[c]
        return out[::-1]

    checked = 0
    with torch.inference_mode():
        for c, parent in enumerate(st.cand_parents):
            if parent < 0:
                continue
            path = path_to(parent)
            toks, feats = [st.cand_tokens[n] for n in path], [st.root]
            for i in range(len(path)):  # the head's own feature predictions are fed back along the path
                cache.rollback(st.slot, committed)
                h = d.d.head.ragged(lm.model, torch.tensor(toks[: i + 1]), torch.stack(feats),
                                    torch.arange(committed, committed + i + 1), [Segment(st.slot, i + 1)], cache)
                feats.append(h[-1])
            cache.rollback(st.slot, committed)
            alone = torch.log_softmax(d.d.lm_head(h[-1:]).float(), -1)[0]
            assert float(alone[st.cand_tokens[c]]) == pytest.approx(logp[c], abs=1e-4)
            checked += 1
    assert checked >= 3 * 3 * 3  # depths 2 to 4 were all expanded


def test_observe_rollback_matches_fresh_start():
    """Following a sequence incrementally (with a rollback) leaves the head where a fresh start would."""
    lm = tiny_model()
    head = random_head(lm)
    full = [2, 8, 1, 9, 4, 4, 7, 3, 11, 5, 6]
    feats = prompt_features(lm, full)
    d = One(head, lm, top_k=3, depth=3, max_nodes=15, max_len=100)
    d.start(full[:5], feats[:4])
    d.draft(20)
    d.observe(full[:9], feats[4:8])  # grow
    d.draft(20)
    other = full[:6] + [30, 31, 32]  # a level above rejected tokens 6.. : the base re-cached from token 5
    d.observe(other, prompt_features(lm, other)[5:8])
    d.observe(full, feats[5:10])  # and back
    got = d.draft(20)
    fresh = One(head, lm, top_k=3, depth=3, max_nodes=15, max_len=100)
    fresh.start(full, feats[:-1])
    want = fresh.draft(20)
    assert got.tokens == want.tokens and got.parents == want.parents
    torch.testing.assert_close(d.st.root, fresh.st.root, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("total", [1, 7, 40, "auto"])
def test_greedy_eagle_equals_autoregressive_on_tiny(total):
    """A random head on a model whose greedy output varies: some of its nodes are accepted, most are not, so the
    verifier's rejections and the cache's compaction of an accepted path off the first slots both run."""
    lm = varied_model()
    head = random_head(lm)
    made = []

    def make():
        made.append(EagleTree(lm, head=head, top_k=4, depth=3, max_nodes=total))
        return made[-1]

    assert_lossless_and_mixed(make, lm, varied_prompts())
    assert made[-1].batch_drafter(1).max_nodes == (63 if total == "auto" else total)


def test_eagle_sampling_runs_and_is_seeded():
    lm = tiny_model()
    head = random_head(lm)
    sp = SamplingParams(max_tokens=30, temperature=0.8, seed=3, ignore_eos=True)
    # a fixed draft length: adaptive drafts follow timed passes, and each draft takes its own random draws
    a = generate(EagleTree(lm, head=head, max_nodes=12, draft_length="fixed"), [1, 2, 3], sp)
    b = generate(EagleTree(lm, head=head, max_nodes=12, draft_length="fixed"), [1, 2, 3], sp)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 30


def test_head_save_load_round_trip(tmp_path):
    lm = tiny_model()
    head = random_head(lm)
    save_head(head, tmp_path / "h", dtype=torch.float32)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["target_hidden"] == 64 and cfg["target_vocab"] == 64
    loaded = load_head(tmp_path / "h", lm)
    names = set(__import__("safetensors.torch").torch.load_file(str(tmp_path / "h" / "model.safetensors")))
    assert not any("embed" in n or "output" in n for n in names)  # no copies of the target's tensors
    x, f = torch.tensor([3, 4, 5]), torch.randn(3, 64)
    torch.testing.assert_close(head_rows(head, lm, x, f), head_rows(loaded, lm, x, f))


def _write_public(head: EagleHead, path, fmt: str, with_embed: bool, lm) -> None:
    """The public EAGLE layout: Llama-style config.json + fc / layers.0.* names."""
    c = head.cfg
    sd = head.state_dict()
    q, k, v = sd["block.attention.wqkv.weight"].split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                                       c.n_kv_heads * c.head_dim])
    gate, up = sd["block.feed_forward.w13.weight"].chunk(2)
    p = "layers.0."
    out = {"fc.weight": sd["fc.weight"], "fc.bias": sd["fc.bias"],
           p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
           p + "self_attn.o_proj.weight": sd["block.attention.wo.weight"],
           p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
           p + "mlp.down_proj.weight": sd["block.feed_forward.w2.weight"],
           p + "post_attention_layernorm.weight": sd["block.ffn_norm.weight"]}
    if "block.attention_norm.weight" in sd:
        out[p + "input_layernorm.weight"] = sd["block.attention_norm.weight"]
    if with_embed:
        out["embed_tokens.weight"] = lm.model.tok_embeddings.weight
    out = {k: t.contiguous().clone() for k, t in out.items()}
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size, "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads, "intermediate_size": c.intermediate_size, "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta, "vocab_size": c.target_vocab, "num_hidden_layers": 1}))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(out, str(path / "model.safetensors"))
    else:
        torch.save(out, path / "pytorch_model.bin")


@pytest.mark.parametrize("fmt,with_embed,attn_norm", [("safetensors", True, True), ("bin", False, False)])
def test_public_eagle_layout(tmp_path, fmt, with_embed, attn_norm):
    lm = tiny_model()
    head = random_head(lm)
    if not attn_norm:  # EAGLE-1 heads have no input norm on their single layer
        head = EagleHead(HeadConfig(**{**head.cfg.__dict__, "attn_norm": False}))
        head.load_state_dict({k: v for k, v in random_head(lm).state_dict().items() if "attention_norm" not in k})
        head.eval()
    _write_public(head, tmp_path / "pub", fmt, with_embed, lm)
    loaded = load_head(tmp_path / "pub", lm)
    assert loaded.cfg.attn_norm == attn_norm
    x, f = torch.tensor([3, 4, 5, 6]), torch.randn(4, 64)
    torch.testing.assert_close(head_rows(head, lm, x, f), head_rows(loaded, lm, x, f))
    r = generate(EagleTree(lm, head=str(tmp_path / "pub"), max_nodes=10), [1, 2, 3],
                 SamplingParams(max_tokens=12, ignore_eos=True))
    assert r.token_ids == generate(Autoregressive(lm), [1, 2, 3], SamplingParams(max_tokens=12, ignore_eos=True)).token_ids


def test_bad_heads_and_params(tmp_path):
    lm = tiny_model()
    other = tiny_model(hidden=32, heads=2, kv_heads=1)
    save_head(random_head(other), tmp_path / "h32")
    with pytest.raises(BadInput, match="does not fit target"):
        load_head(tmp_path / "h32", lm)
    with pytest.raises(BadInput, match="does not fit target"):
        EagleTree(lm, head=random_head(tiny_model(vocab=80)))
    with pytest.raises(BadInput, match="does not fit target"):
        EagleDrafter(random_head(other), lm, max_len=50)
    with pytest.raises(BadInput, match="train-draft"):
        EagleTree(lm)  # nothing shipped for a random model
    with pytest.raises(BadInput, match="not an EAGLE head directory"):
        load_head(tmp_path / "missing", lm)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{}")
    with pytest.raises(BadInput):
        load_head(tmp_path / "junk", lm)
    head = random_head(lm)
    for kw in ({"top_k": 0}, {"depth": 0}, {"max_nodes": 0}, {"max_nodes": 257}, {"max_nodes": "many"}):
        with pytest.raises(BadInput):
            EagleTree(lm, head=head, **kw)


@pytest.mark.slow
def test_shipped_head_is_lossless_on_embedded_model(smollm):
    sp = SamplingParams(max_tokens=32)
    # a fixed tree: the adaptive planner sizes it from timed passes, so τ would depend on the machine's load
    st = EagleTree(smollm, max_nodes=16, draft_length="fixed")
    taus = []
    for text in PROMPTS:
        ids = smollm.tokenizer.chat([{"role": "user", "content": text}])
        want = generate(Autoregressive(smollm), ids, sp).token_ids
        r = generate(st, ids, sp)
        assert r.token_ids == want
        taus.append(r.tau)
    assert sum(taus) / len(taus) > 1.5  # the shipped head really drafts


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_draft_vocabulary_head(tmp_path, quant):
    """A head restricted to a draft vocabulary proposes only those tokens, survives save/load, stays lossless."""
    lm = tiny_model(dtype="fp32" if quant == "none" else "bf16", quant=quant)
    vocab = torch.arange(0, 64, 3)
    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_target(lm), draft_vocab=vocab).eval().requires_grad_(False)
    from specledger.decoding.drafters.eagle_head import draft_lm_head

    h = torch.randn(5, 64, dtype=lm.model.dtype)
    torch.testing.assert_close(draft_lm_head(head, lm.model)(h).float(), lm.model.logits(h)[:, vocab])
    save_head(head, tmp_path / "h")
    loaded = load_head(tmp_path / "h", lm)
    assert loaded.cfg.draft_vocab == vocab.numel() and loaded.draft_vocab.tolist() == vocab.tolist()
    feats = prompt_features(lm, [1, 2, 3])
    d = One(loaded, lm, top_k=4, depth=3, max_nodes=30, max_len=100)
    d.start([1, 2, 3, 4], feats)
    assert set(d.draft(30).tokens) <= set(vocab.tolist())
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    assert generate(EagleTree(lm, head=loaded, max_nodes=20), [5, 6], sp).token_ids == \
        generate(Autoregressive(lm), [5, 6], sp).token_ids


@pytest.mark.parametrize("vocab", [None, torch.arange(0, 64, 2)])
def test_bf16_head_drafting_for_fp32_target_is_lossless(vocab):
    lm = tiny_model()
    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_target(lm), draft_vocab=vocab).eval().requires_grad_(False)
    st = EagleTree(lm, head=head, max_nodes=16, head_dtype="bf16")
    assert st.head.dtype == torch.bfloat16 and head.dtype == torch.float32 and st.params()["head_dtype"] == "bfloat16"
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    assert generate(st, [5, 6, 7], sp).token_ids == generate(Autoregressive(lm), [5, 6, 7], sp).token_ids
    with pytest.raises(BadInput):
        EagleTree(lm, head=head, head_dtype="fp8")


def test_the_embedded_models_head_is_where_the_package_ships_it():
    """specledger/data/heads/<model>: moving eagle_head.py a folder down (decoding/drafters/) once pointed this at
    decoding/data, and every default `eagle` or `hier` on the embedded model said no head is shipped."""
    assert (shipped_head_dir("smollm2-135m") / "config.json").is_file()

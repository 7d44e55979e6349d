"""Self-distillation data (batched greedy generation) and head training."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model
from tests.support.varied_model import prompt_features
from specledger.decoding.autoregressive import Autoregressive
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.engine.ragged import Segment
from specledger.errors import BadInput
from specledger.train.data import _read_shards, answer_stream, read_prompts, save_shard
from specledger.train.trainer import TrainConfig, collate, head_loss, train_head


def generate_batch(lm, prompts, max_tokens, batch_size=64):
    """Greedy answers to `prompts`, in order."""
    got = dict(answer_stream(lm, prompts, max_tokens, batch_size))
    return [got[i] for i in range(len(prompts))]


def load_samples(data_dir, jobs=None):
    """The recorded samples in job order (only jobs below `jobs` if given)."""
    got = [(i, s) for i, s in _read_shards(data_dir) if jobs is None or i < jobs]
    return [s for _, s in sorted(got, key=lambda x: x[0])]


@pytest.mark.parametrize("batch", [2, 8])
def test_batched_generation_matches_single_streams(batch):
    lm = tiny_model(vocab=96)
    lm.config.eos_ids = [7]
    prompts = [[1, 2, 3], [5, 9, 14, 2, 2, 2, 7, 8], [42], [3, 3, 60, 61], [8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 9], [30, 31]]
    samples = generate_batch(lm, prompts, 20, batch_size=batch)
    sp = SamplingParams(max_tokens=20)
    for p, s in zip(prompts, samples):
        want = generate(Autoregressive(lm), p, sp).token_ids
        got = s.tokens[len(p):]
        assert got[: len(want)] == want and (len(got) == 20 or got[-1] == 7)
        assert s.prompt_len == len(p) and s.features.shape == (len(s.tokens) - 1, 64)
        torch.testing.assert_close(s.features, prompt_features(lm, s.tokens[:-1]), rtol=1e-4, atol=1e-4)


class _CharTokenizer:
    def chat(self, messages):
        return [1 + ord(c) % 60 for c in messages[0]["content"]]

    def decode(self, ids):  # the scheduler writes each answer's text
        return "".join(chr(32 + i % 90) for i in ids)


def test_generate_data_resumes(tmp_path):
    from specledger.train.data import generate_data

    lm = tiny_model()
    lm.tokenizer = _CharTokenizer()
    texts = ["hello", "a longer prompt here", "xyz", "q", "another one"]
    meta, _ = generate_data(lm, texts, tmp_path, max_tokens=6, batch_size=2, shard_size=2)
    assert meta["sequences"] == 5 and meta["response_tokens"] == 30
    first = load_samples(tmp_path)
    (tmp_path / "shard_00001.safetensors").unlink()
    seen = []
    generate_data(lm, texts, tmp_path, max_tokens=6, batch_size=2, shard_size=2, on_progress=lambda i, n: seen.append(i))
    assert seen[0] == 3 and seen[-1] == 5
    assert [s.tokens for s in load_samples(tmp_path)] == [s.tokens for s in first]


def test_sampled_answers_extend_the_greedy_data(tmp_path):
    """--samples adds sampled answers after the greedy ones, keeping what was recorded."""
    from specledger.train.data import generate_data

    lm = tiny_model()
    lm.tokenizer = _CharTokenizer()
    texts = ["hello", "a longer prompt here", "xyz"]
    generate_data(lm, texts, tmp_path, max_tokens=12, batch_size=2, shard_size=2)
    greedy = load_samples(tmp_path)
    shards = sorted(p.name for p in tmp_path.glob("shard_*"))
    meta, _ = generate_data(lm, texts, tmp_path, max_tokens=12, batch_size=2, shard_size=2, samples=3,
                         temperature=8.0, seed=1)
    assert meta["sequences"] == 9 and meta["jobs"] == 9 and meta["key"].endswith("-3x8-1")
    assert set(shards) <= {p.name for p in tmp_path.glob("shard_*")}  # the greedy shards stay
    got = load_samples(tmp_path)
    assert [s.tokens for s in got[:3]] == [s.tokens for s in greedy]
    for i, s in enumerate(got[3:]):  # same prompts again, answered by sampling
        assert s.tokens[: s.prompt_len] == greedy[i % 3].tokens[: s.prompt_len]
    answers = {tuple(s.tokens) for s in got}
    assert len(answers) > 3  # a random-weight model at temperature 8: sampled answers differ from greedy
    assert len(load_samples(tmp_path, jobs=3)) == 3
    with pytest.raises(BadInput):
        generate_data(lm, texts, tmp_path, max_tokens=12, samples=0)


def test_shards_round_trip(tmp_path):
    lm = tiny_model()
    samples = generate_batch(lm, [[1, 2], [3, 4, 5]], 6)
    save_shard(tmp_path / "shard_00000.safetensors", samples)
    back = load_samples(tmp_path)
    assert [s.tokens for s in back] == [s.tokens for s in samples]
    torch.testing.assert_close(back[1].features.float(), samples[1].features, rtol=1e-2, atol=1e-2)


def test_read_prompts_errors(tmp_path):
    with pytest.raises(BadInput):
        read_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"kind": "qa"}\n')
    with pytest.raises(BadInput, match="bad.jsonl:1"):
        read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "ok.jsonl").write_text('{"prompt": "a"}\n\n{"turns": ["b", "c"]}\n')
    assert read_prompts(tmp_path / "ok.jsonl") == ["a", "b"]


def _data(lm, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 64, (int(torch.randint(2, 8, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]
    return generate_batch(lm, prompts, 24)


def test_training_lowers_the_loss_and_resumes(tmp_path):
    torch.set_num_threads(2)
    lm = tiny_model()
    samples = _data(lm)
    cfg = TrainConfig(epochs=6, lr=3e-3, warmup_steps=3, batch_tokens=128, bf16_autocast=False, seed=1,
                      checkpoint_every=1, val_fraction=0.0, unroll=2)
    batch = collate(samples, list(range(len(samples))))
    from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig

    torch.manual_seed(cfg.seed)
    before = head_loss(EagleHead(HeadConfig.for_target(lm)).eval(), lm, batch, cfg)[1]
    head, summary = train_head(lm, samples, cfg, tmp_path / "a")
    after = head_loss(head, lm, batch, cfg)[1]
    assert after["loss"] < 0.7 * before["loss"] and after["acc"] > before["acc"]
    assert summary["steps"] > 6 and len(summary["history"]) == 6

    class Stop(Exception):
        pass

    def interrupt(step, total, avg):
        if step == 5:
            raise Stop

    with pytest.raises(Stop):
        train_head(lm, samples, cfg, tmp_path / "b", on_step=interrupt)
    resumed, _ = train_head(lm, samples, cfg, tmp_path / "b", resume=True)
    for (n, a), (_, b) in zip(head.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=n)


def _feed(head, lm, cache, tokens, feats, start):
    """The head fed entries at positions start.. after what slot 0 of its cache holds (causal), as drafting does."""
    n = len(tokens)
    return head.ragged(lm.model, torch.tensor(tokens), feats, torch.arange(start, start + n), [Segment(0, n)], cache)


def test_unrolled_steps_see_what_tree_nodes_see():
    """Unroll step s at entry i equals feeding the head its own prediction as a depth s-1 node would."""
    from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig
    from specledger.train.trainer import unrolled

    lm = tiny_model()
    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_target(lm)).eval()
    toks = [3, 9, 1, 4, 4, 8, 2, 7, 5, 6, 11, 12]
    feats = prompt_features(lm, toks)
    with torch.no_grad():
        hs = unrolled(head, lm, torch.tensor([toks]), feats[None, :10], 3)
        part = unrolled(head, lm, torch.tensor([toks]), feats[None, :10], 3, start=4)  # steps >= 2 from entry 4
        for s in (1, 2):
            torch.testing.assert_close(part[s], hs[s][:, 4:], rtol=1e-4, atol=1e-4)
        for i in (0, 5, 8):
            cache = head.new_slot_cache(1, 20)
            cache.alloc()
            a = _feed(head, lm, cache, toks[1 : i + 2], feats[: i + 1], 0)
            torch.testing.assert_close(a[-1], hs[0][0, i])
            b = _feed(head, lm, cache, [toks[i + 2]], a[-1:], i + 1)
            torch.testing.assert_close(b[0], hs[1][0, i], rtol=1e-4, atol=1e-4)
            if i + 3 <= 10:  # beyond, step 3 has no targets (entries padded)
                c = _feed(head, lm, cache, [toks[i + 3]], b, i + 2)
                torch.testing.assert_close(c[0], hs[2][0, i], rtol=1e-4, atol=1e-4)
    with pytest.raises(BadInput):
        train_head(lm, _data(lm, n=4), TrainConfig(labels="hard", prompt_loss=True), "/tmp/unused")

"""An untied tiny random model whose greedy output varies, for lossless tests that can fail.

The tied tiny model of conftest.py keeps the residual stream close to the input token's
embedding, so its greedy continuation soon repeats one token: a speculative strategy then has
every proposal accepted (lookup, draft) or none (a random EAGLE head), and rejection and
cache rollback are never exercised. Here the layers are ~3x stronger than conftest's and the
output matrix is separate, so greedy continuations wander over the vocabulary with some
repetition: prompt lookup, a perturbed draft model and a random EAGLE head are each right
sometimes and wrong sometimes (test_lossless.py asserts both).

Also here: the batching tests' own untied model (batching_model, vocabulary 97) and `alone`, a request decoded
on its own, which every batched request must equal.
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from tests.conftest import tiny_config, tiny_tensors
from specledger.decoding.factory import make_strategy
from specledger.decoding.sizing.planner import CostSurface
from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig
from specledger.decoding.loop import generate as solo
from specledger.decoding.loop.generate import GenerationResult, generate
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import ScheduledResult, Scheduler
from specledger.engine.config import ModelConfig
from specledger.engine.loader import LoadedModel, build_model, weight_bytes

LAYER_SCALE = 3.0  # layer weights relative to conftest's (embeddings and norms kept)


def varied_tensors(vocab: int, seed: int = 0, noise: float = 0.0, noise_seed: int = 1) -> dict[str, torch.Tensor]:
    """Tensors of the varied model; noise > 0 perturbs every tensor by that fraction of its spread
    (a cheap stand-in for a smaller or quantized draft model that mostly agrees with the target)."""
    cfg = varied_config(vocab)
    t = tiny_tensors(cfg, seed, LAYER_SCALE)
    for k in t:
        if k == "embed":
            t[k] = t[k] / LAYER_SCALE
        elif k.endswith("norm"):
            t[k] = 1 + (t[k] - 1) / LAYER_SCALE
    t["output"] = torch.randn(vocab, cfg.hidden_size, generator=torch.Generator().manual_seed(seed + 1000)) * 0.3
    if noise:
        g = torch.Generator().manual_seed(noise_seed)
        t = {k: v + torch.randn(v.shape, generator=g) * noise * v.std() for k, v in t.items()}
    return t


def varied_config(vocab: int):
    return dataclasses.replace(tiny_config(vocab=vocab), tie_embeddings=False)


def varied_model(vocab: int = 16, seed: int = 0, noise: float = 0.0, noise_seed: int = 1, dtype: str = "fp32",
                 quant: str = "none", device: str = "cpu") -> LoadedModel:
    cfg = varied_config(vocab)
    model = build_model(cfg, varied_tensors(vocab, seed, noise, noise_seed), dtype=dtype, quant=quant, device=device)
    return LoadedModel(model=model, tokenizer=None, config=cfg, name=f"varied{seed}" + (f"~{noise}" if noise else ""),
                       source=f"random:varied:{vocab}:{seed}:{noise}:{noise_seed}", dtype=dtype, quant=quant, group_size=32 if quant == "int4" else None,
                       device=device, weight_bytes=weight_bytes(model), load_s=0.0)


def varied_prompts(vocab: int = 16, n: int = 3, length: int = 8, seed: int = 0) -> list[list[int]]:
    """Random prompts, each repeated once so that prompt lookup finds matches."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() * 2 for _ in range(n)]


def run_all(sched: Scheduler) -> list[ScheduledResult]:
    """Step until nothing is waiting or running; the results in the order they finished."""
    done: list[ScheduledResult] = []
    while sched.has_work():
        done.extend(sched.step())
    return done


FLAT = CostSurface((1,), (1.0,))  # every pass costs the same: a planner finds every draft worth verifying


def random_head(lm: LoadedModel, seed: int = 0) -> EagleHead:
    """An untrained EAGLE head for the target: its drafts are mostly wrong, so rejection is exercised."""
    torch.manual_seed(seed)
    return EagleHead(HeadConfig.for_target(lm)).eval().requires_grad_(False)


def drafting(strategy):
    """The strategy, its generate() planning with FLAT costs: it drafts every step, so acceptance, rejection and
    rollback are exercised (a measured tiny model's cost can make drafting not pay at all). Its batch-of-one
    scheduler is made here as generate.solo_scheduler makes it, with the FLAT cost in place of a measured one."""
    sched = solo._SOLO[strategy] = Scheduler(strategy.target, max_batch=1, drafter=strategy.batch_drafter(1),
                                             cost=FLAT, prefix_cache=False, draft_length=strategy.draft_length)
    solo._LOCKS[sched] = threading.Lock()
    return strategy


@torch.inference_mode()
def plain_greedy(lm: LoadedModel, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by the definition: the whole sequence through the model for every token, no cache kept,
    no scheduler (the reference every decoding path must equal)."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(lm.model(torch.tensor([seq]), lm.model.new_cache(len(seq)))[0, -1].argmax()))
    return seq[len(prompt):]


@torch.inference_mode()
def prompt_features(lm: LoadedModel, tokens: list[int]) -> torch.Tensor:
    """The model's final-normed features of every token, one plain pass (what a verifier hands a drafter)."""
    return lm.model.hidden(torch.tensor([tokens]), lm.model.new_cache(len(tokens)))[0]


def assert_lossless_and_mixed(make, target: LoadedModel, prompts: list[list[int]], max_tokens: int = 40) -> dict:
    """Greedy output of make() equals plain greedy decoding on every prompt, and at every level some
    proposals were accepted and some rejected (so both verification paths and cache rollback ran).

    Returns {level name: [proposed, accepted]} summed over the prompts."""
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    totals: dict[str, list[int]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: OpenMP hand-offs would dominate
    try:
        for prompt in prompts:
            want = plain_greedy(target, prompt, max_tokens)
            assert len(set(want)) >= 4, "the target's greedy output should vary"
            r = generate(drafting(make()), prompt, sp)
            assert r.token_ids == want
            assert r.appended == r.steps + r.levels[-1].accepted  # each target step: its accepted tokens + 1
            for lv in r.levels:
                assert 0 <= lv.accepted <= lv.proposed
                t = totals.setdefault(lv.name, [0, 0])
                t[0] += lv.proposed
                t[1] += lv.accepted
    finally:
        torch.set_num_threads(threads)
    for name, (proposed, accepted) in totals.items():
        assert 0 < accepted < proposed, f"level {name}: {accepted} of {proposed} accepted; want some of each"
    return totals


def untied_tiny_model(seed: int = 0, dtype: str = "fp32", quant: str = "none", **cfg_kw) -> LoadedModel:
    """conftest's tiny model with its own output layer. With tied random embeddings every position's argmax is its
    input token whatever the other weights are, so agreement between two such models says nothing."""
    cfg = dataclasses.replace(tiny_config(**cfg_kw), tie_embeddings=False)
    g = torch.Generator().manual_seed(seed + 1000)
    tensors = tiny_tensors(cfg, seed) | {"output": torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)}
    model = build_model(cfg, tensors, dtype=dtype, quant=quant, group_size=32)
    return LoadedModel(model=model, tokenizer=None, config=cfg, name=f"untied{seed}",
                       source=f"random:untied:{seed}:{sorted(cfg_kw.items())}", dtype=dtype,
                       quant=quant, group_size=32 if quant == "int4" else None, device="cpu",
                       weight_bytes=weight_bytes(model), load_s=0.0)


BATCHING_VOCAB = 97


class CharTokenizer:
    """Enough of a tokenizer for stop strings and chat prompts: token i is one letter."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)

    def chat(self, messages: list[dict]) -> list[int]:
        return [ord(c) % BATCHING_VOCAB for c in "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"]


def batching_model(seed: int = 3, eos: list[int] | None = None, tokenizer=None, dtype: str = "fp32",
                   quant: str = "none", device: str = "cpu") -> LoadedModel:
    """The batching tests' model: vocabulary 97, random weights, untied embeddings (a tied random model tends to
    echo its input), so greedy outputs vary and a mixed-up row, position or cache slot shows."""
    cfg = ModelConfig(vocab_size=BATCHING_VOCAB, hidden_size=64, intermediate_size=128, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, max_seq_len=256, tie_embeddings=False, eos_ids=list(eos or []))
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.08):
        return torch.randn(*shape, generator=g) * s

    h, i = cfg.hidden_size, cfg.intermediate_size
    t = {"embed": r(BATCHING_VOCAB, h, s=1.0), "output": r(BATCHING_VOCAB, h, s=0.3), "norm": 1 + r(h, s=0.1)}
    for n in range(cfg.n_layers):
        p = f"layers.{n}"
        t |= {f"{p}.attn_norm": 1 + r(h, s=0.1), f"{p}.ffn_norm": 1 + r(h, s=0.1), f"{p}.q": r(h, h, s=0.3),
              f"{p}.k": r(32, h, s=0.3), f"{p}.v": r(32, h), f"{p}.o": r(h, h), f"{p}.gate": r(i, h),
              f"{p}.up": r(i, h), f"{p}.down": r(h, i)}
    model = build_model(cfg, t, dtype=dtype, quant=quant, group_size=32, device=device)
    return LoadedModel(model=model, tokenizer=tokenizer, config=cfg, name=f"untied{seed}", source=f"random:batching:{seed}",
                       dtype=dtype, quant=quant, group_size=32 if quant == "int4" else None, device=device,
                       weight_bytes=weight_bytes(model), load_s=0.0)


def alone(lm: LoadedModel, prompt: list[int], sp: SamplingParams) -> GenerationResult:
    """`prompt` through autoregressive decoding on its own: what a batched request must equal."""
    return generate(make_strategy("ar", target=lm), prompt, sp)


def run_joining(sched: Scheduler, prompts: list[list[int]], max_new: list[int]) -> dict:
    """Two requests first, one more every two steps, until all are in and done."""
    rids: dict[int, int] = {}
    results = {}
    pending = list(range(len(prompts)))
    step = 0
    while pending or sched.has_work():
        if pending and (step % 2 == 0 or len(rids) < 2):
            i = pending.pop(0)
            rids[sched.add(prompts[i], SamplingParams(max_tokens=max_new[i], temperature=0.0))] = i
        for r in sched.step():
            results[rids[r.request_id]] = r
        step += 1
    return results

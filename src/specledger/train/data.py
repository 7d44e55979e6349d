"""Self-distillation data: the target answers a prompt set greedily, in batches; keep tokens + features.

A sequence of L tokens is stored with the target's final-normed features of its first L-1
tokens (the last token is never fed). Batches are written as shards as they finish, so an
interrupted run resumes where it stopped; training reads the shards without the target
having to generate again.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Hashable
from typing import Callable, Iterator

import torch

from specledger.decoding.drafters.base import DraftSeq, Stateless
from specledger.decoding.sampling import SamplingParams
from specledger.decoding.loop.scheduler import Scheduler
from specledger.engine.loader import LoadedModel
from specledger.errors import BadInput

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "train_prompts.jsonl"


def read_prompts(path: str | Path | None = None, limit: int | None = None) -> list[str]:
    """One JSON object per line with a "prompt" (or a Spec-Bench "turns" list: its first turn)."""
    p = Path(path) if path else DEFAULT_PROMPTS
    if not p.is_file():
        raise BadInput(f"prompt file {p} not found")
    out: list[str] = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj["prompt"] if "prompt" in obj else obj["turns"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise BadInput(f"{p}:{n}: expected a JSON object with a 'prompt' string") from None
        if not isinstance(text, str) or not text.strip():
            raise BadInput(f"{p}:{n}: empty prompt")
        out.append(text)
    if not out:
        raise BadInput(f"prompt file {p} holds no prompts")
    return out[:limit] if limit else out


@dataclass
class Sample:
    tokens: list[int]  # prompt + response
    prompt_len: int
    features: torch.Tensor  # (len(tokens) - 1, H)


class _Recorder(Stateless):
    """A drafter that never drafts: the scheduler's hook for the target's features of every token it feeds, kept
    per answer with its tokens (an eos that ended it included: the head learns to predict it too)."""

    wants_features = True

    def __init__(self) -> None:
        self.feats: dict[Hashable, list[torch.Tensor]] = {}
        self.done: dict[Hashable, tuple[list[int], torch.Tensor]] = {}

    def begin(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        self.feats[seq.key] = []
        self.accept(seq, features)

    def accept(self, seq: DraftSeq, features: torch.Tensor | None) -> None:
        assert features is not None  # (wants_features)
        self.feats[seq.key].append(features.clone())  # (a view of the pass, or of the slot's buffer)

    def end(self, seq: DraftSeq) -> None:
        self.done[seq.key] = (list(seq.tokens), torch.cat(self.feats.pop(seq.key)))


@torch.inference_mode()
def answer_stream(lm: LoadedModel, prompts: list[list[int]], max_tokens: int, batch_size: int = 64,
                  temperatures: list[float] | None = None, seed: int = 0) -> Iterator[tuple[int, Sample]]:
    """Answers with the features of every fed token, yielded (prompt index, sample) as they finish: the engine's
    one decoding loop (the scheduler, batch_size sequences at once) with a drafter that only records.

    temperatures: per prompt, 0 = greedy (the default for all); above 0 the answer is sampled (seeded by `seed`
    and the prompt's index), which gives further, different answers to the same prompt (more data for the head).
    """
    rec = _Recorder()
    sched = Scheduler(lm, max_batch=max(1, min(batch_size, len(prompts))), drafter=rec, draft_length="fixed",
                      max_len=max(len(p) for p in prompts) + max_tokens)
    temps = temperatures or [0.0] * len(prompts)
    index = {sched.add(p, SamplingParams(max_tokens=max_tokens, temperature=t, seed=(seed << 32) + i)): i
             for i, (p, t) in enumerate(zip(prompts, temps))}
    while sched.has_work():
        for res in sched.step():
            if res.error is not None:
                raise res.exception or RuntimeError(res.error)
            tokens, feats = rec.done.pop(res.request_id)
            i = index[res.request_id]
            yield i, Sample(tokens, len(prompts[i]), feats)


def save_shard(path: Path, samples: list[Sample], seconds: float = 0.0, index: list[int] | None = None) -> None:
    """One safetensors file: tokens, lengths, prompt lengths, bf16 features, and prompt indices."""
    from safetensors.torch import save_file

    toks = torch.tensor([t for s in samples for t in s.tokens], dtype=torch.int32)
    save_file(
        {
            "tokens": toks,
            "lengths": torch.tensor([len(s.tokens) for s in samples], dtype=torch.int32),
            "prompt_lens": torch.tensor([s.prompt_len for s in samples], dtype=torch.int32),
            "index": torch.tensor(index if index is not None else range(len(samples)), dtype=torch.int32),
            "features": torch.cat([s.features for s in samples]).to(torch.bfloat16).contiguous(),
        },
        str(path.with_suffix(".tmp")),
        metadata={"seconds": f"{seconds:.3f}"},
    )
    path.with_suffix(".tmp").rename(path)


def shard_seconds(data_dir: str | Path) -> float:
    """Time the target spent answering, summed over the shards (also over interrupted runs)."""
    from safetensors import safe_open

    total = 0.0
    for sh in Path(data_dir).glob("shard_*.safetensors"):
        with safe_open(str(sh), "pt") as f:
            total += float((f.metadata() or {}).get("seconds", 0.0))
    return total


def _read_shards(data_dir: Path) -> list[tuple[int, Sample]]:
    from safetensors.torch import load_file

    out: list[tuple[int, Sample]] = []
    for sh in sorted(data_dir.glob("shard_*.safetensors")):
        t = load_file(str(sh))
        toks, feats = t["tokens"].tolist(), t["features"]
        index = t["index"].tolist() if "index" in t else [-1] * len(t["lengths"])
        a = fa = 0
        for i, n, p in zip(index, t["lengths"].tolist(), t["prompt_lens"].tolist()):
            out.append((i, Sample(toks[a : a + n], p, feats[fa : fa + n - 1])))
            a, fa = a + n, fa + n - 1
    return out


def generate_data(lm: LoadedModel, prompts: list[str], out_dir: str | Path, *, max_tokens: int = 192,
                  batch_size: int = 64, shard_size: int = 64, max_prompt_tokens: int = 512, samples: int = 1,
                  temperature: float = 0.8, seed: int = 0,
                  on_progress: Callable[[int, int], None] | None = None) -> tuple[dict, list[Sample]]:
    """Answer every prompt (chat template) and write shards; answers recorded in earlier runs are kept.

    Returns the data's description (also written to meta.json) and the answers, in job order.

    The first answer to each prompt is greedy; `samples` > 1 adds samples - 1 answers drawn at
    `temperature`. Raising `samples` later keeps the answers already recorded.
    """
    if samples < 1 or temperature <= 0:
        raise BadInput(f"samples must be >= 1 and temperature > 0 (got {samples}, {temperature})")
    tok = lm.tokenizer
    if tok is None:
        raise BadInput(f"model {lm.label} has no tokenizer: the prompts need its chat template")
    ids = [tok.chat([{"role": "user", "content": p}]) for p in prompts]
    ids = [x for x in ids if len(x) <= max_prompt_tokens]
    skipped = len(prompts) - len(ids)
    ids.sort(key=len)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1(json.dumps([lm.label, max_tokens, ids]).encode()).hexdigest()[:16]  # what the answers depend on
    plan = out / "plan.json"
    old = json.loads(plan.read_text()) if plan.exists() else {}
    sampling = {"temperature": temperature, "seed": seed}
    got = _read_shards(out)
    n_greedy = len(ids)
    if old.get("key") != key or (old.get("sampling", sampling) != sampling and any(i >= n_greedy for i, _ in got)):
        for f in out.glob("shard_*.safetensors"):
            f.unlink()
        got = []
    plan.write_text(json.dumps({"key": key, "model": lm.label, "prompts": len(ids), "max_tokens": max_tokens,
                                "samples": samples, "sampling": sampling}))
    jobs = ids * samples  # job j answers prompt j % len(ids); the first round is greedy
    temps = [0.0 if j < n_greedy else temperature for j in range(len(jobs))]
    recorded = dict(got)  # job -> sample, grown as answers arrive (the shards are read once)
    todo = [i for i in range(len(jobs)) if i not in recorded]
    n_shard = 1 + max((int(p.stem.split("_")[1]) for p in out.glob("shard_*.safetensors")), default=-1)
    buf: list[tuple[int, Sample]] = []
    t0 = time.perf_counter()
    if on_progress:
        on_progress(len(recorded), len(jobs))
    if todo:  # a shard every shard_size answers, and one for the last few
        stream = answer_stream(lm, [jobs[i] for i in todo], max_tokens, batch_size,
                               temperatures=[temps[i] for i in todo], seed=seed + len(recorded))
        for done, (j, sample) in enumerate(stream, 1):
            buf.append((todo[j], sample))
            recorded[todo[j]] = sample
            if on_progress:
                on_progress(len(recorded), len(jobs))
            if len(buf) >= shard_size or done == len(todo):
                save_shard(out / f"shard_{n_shard:05d}.safetensors", [s for _, s in buf], time.perf_counter() - t0,
                           [i for i, _ in buf])
                n_shard, buf, t0 = n_shard + 1, [], time.perf_counter()
    answers = [recorded[i] for i in sorted(recorded) if i < len(jobs)]
    meta = {"generation_s": round(shard_seconds(out), 1),
            "key": key if samples == 1 else f"{key}-{samples}x{temperature:g}-{seed}", "jobs": len(jobs),
            "model": lm.label, "sequences": len(answers), "skipped_long_prompts": skipped,
            "tokens": sum(len(s.tokens) for s in answers),
            "response_tokens": sum(len(s.tokens) - s.prompt_len for s in answers), "max_tokens": max_tokens,
            "samples_per_prompt": samples, "temperature": temperature if samples > 1 else None}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta, answers

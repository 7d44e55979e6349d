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
from typing import Callable

import torch

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


@torch.inference_mode()
def generate_batch(lm: LoadedModel, prompts: list[list[int]], max_new_tokens: int) -> list[Sample]:
    """Greedy answers to several prompts at once (left-padded), with the features of every fed token."""
    m = lm.model
    dev = m.device
    b = len(prompts)
    plen = max(len(p) for p in prompts)
    total = plen + max_new_tokens
    pad = torch.tensor([plen - len(p) for p in prompts], device=dev)
    x = torch.zeros(b, plen, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        x[i, plen - len(p) :] = torch.tensor(p)
    cache = m.new_cache(total, batch=b)
    slots = torch.arange(total, device=dev)
    valid = slots[None, :] >= pad[:, None]  # (B, S): keys that are real tokens
    positions = (torch.arange(plen, device=dev)[None, :] - pad[:, None]).clamp(min=0)
    causal = torch.ones(plen, plen, dtype=torch.bool, device=dev).tril()
    mask = (causal[None] & valid[:, None, :plen]) | torch.eye(plen, dtype=torch.bool, device=dev)[None]
    h = m.hidden(x, cache, positions=positions, mask=mask[:, None])
    feats = [[h[i, plen - len(p) :]] for i, p in enumerate(prompts)]
    nxt = m.logits(h[:, -1]).argmax(-1)
    eos = torch.tensor(sorted(lm.config.eos_ids) or [-1], device=dev)
    out = [[] for _ in range(b)]
    rows = list(range(b))  # original index of each batch row
    active = torch.ones(b, dtype=torch.bool, device=dev)
    for step in range(max_new_tokens):
        for r, i in enumerate(rows):
            if active[r]:
                out[i].append(int(nxt[r]))
        active &= ~torch.isin(nxt, eos)
        if step == max_new_tokens - 1 or not bool(active.any()):
            break
        if int((~active).sum()) * 4 >= len(rows):  # drop finished rows (copying the cache) now and then
            keep = active.nonzero().flatten()
            rows = [rows[int(r)] for r in keep]
            cache.k, cache.v = cache.k[:, keep], cache.v[:, keep]
            nxt, pad, valid, active = nxt[keep], pad[keep], valid[keep], active[keep]
        s = cache.length
        h = m.hidden(nxt[:, None], cache, positions=(s - pad)[:, None], mask=valid[:, None, None, : s + 1])
        for r, i in enumerate(rows):
            if active[r]:
                feats[i].append(h[r])
        nxt = m.logits(h[:, 0]).argmax(-1)
    samples = []
    for i, p in enumerate(prompts):
        f = torch.cat(feats[i])
        toks = list(p) + out[i]
        samples.append(Sample(toks, len(p), f[: len(toks) - 1].clone()))
    return samples


def _plan_key(lm: LoadedModel, prompts: list[list[int]], max_new_tokens: int, batch_size: int) -> str:
    h = hashlib.sha1(json.dumps([lm.label, max_new_tokens, batch_size, prompts]).encode()).hexdigest()
    return h[:16]


def save_shard(path: Path, samples: list[Sample], seconds: float = 0.0) -> None:
    from safetensors.torch import save_file

    toks = torch.tensor([t for s in samples for t in s.tokens], dtype=torch.int32)
    save_file(
        {
            "tokens": toks,
            "lengths": torch.tensor([len(s.tokens) for s in samples], dtype=torch.int32),
            "prompt_lens": torch.tensor([s.prompt_len for s in samples], dtype=torch.int32),
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


def load_samples(data_dir: str | Path) -> list[Sample]:
    from safetensors.torch import load_file

    d = Path(data_dir)
    shards = sorted(d.glob("shard_*.safetensors"))
    if not shards:
        raise BadInput(f"{d}: no training data shards")
    out: list[Sample] = []
    for sh in shards:
        t = load_file(str(sh))
        toks, feats = t["tokens"].tolist(), t["features"]
        a = fa = 0
        for n, p in zip(t["lengths"].tolist(), t["prompt_lens"].tolist()):
            out.append(Sample(toks[a : a + n], p, feats[fa : fa + n - 1]))
            a, fa = a + n, fa + n - 1
    return out


def generate_data(
    lm: LoadedModel,
    prompts: list[str],
    out_dir: str | Path,
    *,
    max_new_tokens: int = 192,
    batch_size: int = 32,
    max_prompt_tokens: int = 512,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict:
    """Answer every prompt (chat template) and write shards; already written shards are kept."""
    tok = lm.tokenizer
    ids = [tok.chat([{"role": "user", "content": p}]) for p in prompts]
    ids = [x for x in ids if len(x) <= max_prompt_tokens]
    skipped = len(prompts) - len(ids)
    ids.sort(key=len)  # similar lengths share a batch: little padding
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = _plan_key(lm, ids, max_new_tokens, batch_size)
    plan = out / "plan.json"
    if plan.exists() and json.loads(plan.read_text()).get("key") != key:
        for old in out.glob("shard_*.safetensors"):
            old.unlink()
    plan.write_text(json.dumps({"key": key, "model": lm.label, "prompts": len(ids), "max_new_tokens": max_new_tokens}))
    batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
    for n, batch in enumerate(batches):
        shard = out / f"shard_{n:05d}.safetensors"
        if not shard.exists():
            t0 = time.perf_counter()
            samples = generate_batch(lm, batch, max_new_tokens)
            save_shard(shard, samples, time.perf_counter() - t0)
        if on_batch:
            on_batch(n + 1, len(batches))
    samples = load_samples(out)
    meta = {
        "generation_s": round(shard_seconds(out), 1),
        "key": key,
        "model": lm.label,
        "sequences": len(samples),
        "skipped_long_prompts": skipped,
        "tokens": sum(len(s.tokens) for s in samples),
        "response_tokens": sum(len(s.tokens) - s.prompt_len for s in samples),
        "max_new_tokens": max_new_tokens,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta

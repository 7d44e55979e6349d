"""Train an EAGLE head on recorded target features (EAGLE-1 loss), resumably.

Entry i of a sequence sees (f_i + noise, token i+1) and must predict f_{i+1} (SmoothL1)
and, through the target's frozen LM head, token i+2 (cross-entropy, weight 0.1). Only
entries whose next token the target itself generated count. The noise on the input
features makes the head tolerate its own imperfect predictions, which it is fed from the
second tree level on.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from specledger.decoding.eagle_head import EagleHead, HeadConfig, draft_lm_head
from specledger.engine.loader import LoadedModel
from specledger.train.data import Sample


@dataclass
class TrainConfig:
    epochs: int = 4
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    batch_tokens: int = 1024  # padded tokens per optimisation step
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    noise: float = 0.2  # width of the uniform noise added to input features
    p_weight: float = 0.1  # cross-entropy weight (EAGLE-1)
    val_fraction: float = 0.03
    seed: int = 0
    bf16_autocast: bool = True
    checkpoint_every: int = 100
    draft_vocab: int = 8192  # most frequent answer tokens the head may propose; 0 = the whole vocabulary


@dataclass
class Batch:
    tokens: torch.Tensor  # (B, L)
    features: torch.Tensor  # (B, L - 1, H)
    mask: torch.Tensor  # (B, L - 2): entries with a generated next token


def make_batches(samples: list[Sample], batch_tokens: int) -> list[list[int]]:
    """Sequences sorted by length, chunked so each batch pads to at most batch_tokens."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].tokens))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(samples[i].tokens) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def collate(samples: list[Sample], idx: list[int]) -> Batch:
    seqs = [samples[i] for i in idx]
    L = max(len(s.tokens) for s in seqs)
    H = seqs[0].features.shape[1]
    toks = torch.zeros(len(seqs), L, dtype=torch.long)
    feats = torch.zeros(len(seqs), L - 1, H)
    mask = torch.zeros(len(seqs), max(L - 2, 0), dtype=torch.bool)
    for b, s in enumerate(seqs):
        n = len(s.tokens)
        toks[b, :n] = torch.tensor(s.tokens)
        feats[b, : n - 1] = s.features.float()
        mask[b, max(s.prompt_len - 2, 0) : max(n - 2, 0)] = True
    return Batch(toks, feats, mask)


def pick_draft_vocab(samples: list[Sample], size: int, vocab_size: int, always: list[int] = ()) -> torch.Tensor | None:
    """The `size` tokens the target answers with most often (plus `always`), sorted; None = everything."""
    if size <= 0 or size >= vocab_size:
        return None
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(torch.tensor(s.tokens[s.prompt_len :], dtype=torch.long), minlength=vocab_size)
    counts[list(always)] = counts.max() + 1
    return counts.topk(size).indices.sort().values


def head_loss(
    head: EagleHead, base: LoadedModel, batch: Batch, cfg: TrainConfig, gen: torch.Generator | None = None
) -> tuple[torch.Tensor, dict]:
    """EAGLE-1 loss on one batch; also the head's top-1 agreement with the target's tokens."""
    L = batch.tokens.shape[1]
    f_in = batch.features[:, : L - 2]
    if cfg.noise > 0 and head.training:
        f_in = f_in + (torch.rand(f_in.shape, generator=gen) - 0.5) * cfg.noise
    cache = head.new_cache(L - 2, batch=batch.tokens.shape[0])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
        h = head.hidden(base.model, batch.tokens[:, 1 : L - 1], f_in, cache)
        m = batch.mask
        h_sel = h[m]
        logits = draft_lm_head(head, base.model)(h_sel).float()
    v_loss = F.smooth_l1_loss(h_sel.float(), batch.features[:, 1 : L - 1][m])
    target = batch.tokens[:, 2:L][m]
    guess = logits.argmax(-1)
    if head.draft_vocab is not None:  # targets outside the draft vocabulary cannot be learned: ignored
        index = torch.full((base.config.vocab_size,), -100, dtype=torch.long)
        index[head.draft_vocab] = torch.arange(head.draft_vocab.numel())
        guess = head.draft_vocab[guess]
        mapped = index[target]
        p_loss = F.cross_entropy(logits, mapped, ignore_index=-100) if bool((mapped >= 0).any()) else logits.sum() * 0
    else:
        p_loss = F.cross_entropy(logits, target)
    acc = (guess == target).float().mean()
    loss = v_loss + cfg.p_weight * p_loss
    return loss, {"loss": loss.item(), "v_loss": v_loss.item(), "p_loss": p_loss.item(), "acc": acc.item(), "n": int(m.sum())}


def _coverage(samples: list[Sample], vocab: torch.Tensor | None) -> float:
    """Share of the target's answer tokens that the draft vocabulary can propose."""
    if vocab is None:
        return 1.0
    inside = set(vocab.tolist())
    toks = [t for s in samples for t in s.tokens[s.prompt_len :]]
    return round(sum(t in inside for t in toks) / max(1, len(toks)), 4)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@torch.no_grad()
def evaluate(head: EagleHead, base: LoadedModel, samples: list[Sample], batches: list[list[int]], cfg: TrainConfig) -> dict:
    head.eval()
    tot: dict[str, float] = {}
    n = 0
    for idx in batches:
        _, st = head_loss(head, base, collate(samples, idx), cfg)
        for k in ("loss", "v_loss", "p_loss", "acc"):
            tot[k] = tot.get(k, 0.0) + st[k] * st["n"]
        n += st["n"]
    head.train()
    return {k: v / max(n, 1) for k, v in tot.items()}


def train_head(
    base: LoadedModel,
    samples: list[Sample],
    cfg: TrainConfig,
    work_dir: str | Path,
    *,
    resume: bool = False,
    data_key: str = "",
    on_step: Callable[[int, int, dict], None] | None = None,
) -> tuple[EagleHead, dict]:
    """Train a fresh head (or resume from work_dir/checkpoint.pt); return it and a summary."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    ckpt_path = work / "checkpoint.pt"
    split = torch.randperm(len(samples), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    n_val = int(len(samples) * cfg.val_fraction) if len(samples) >= 20 else 0
    val_set = set(split[:n_val])
    train_s = [s for i, s in enumerate(samples) if i not in val_set]
    val_s = [s for i, s in enumerate(samples) if i in val_set]
    vocab = pick_draft_vocab(train_s, cfg.draft_vocab, base.config.vocab_size, base.config.eos_ids)
    torch.manual_seed(cfg.seed)
    head = EagleHead(HeadConfig.for_target(base), draft_vocab=vocab).float()
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    train_b = make_batches(train_s, cfg.batch_tokens)
    val_b = make_batches(val_s, cfg.batch_tokens)
    total = cfg.epochs * len(train_b)

    step, elapsed, history = 0, 0.0, []
    if resume and ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck.get("config") == asdict(cfg) and ck.get("data_key") == data_key:
            head.load_state_dict(ck["head"])
            opt.load_state_dict(ck["opt"])
            step, elapsed, history = ck["step"], ck["elapsed"], ck["history"]

    def save_ckpt() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "history": history, "config": asdict(cfg), "data_key": data_key}, tmp)
        tmp.rename(ckpt_path)

    t_start = time.perf_counter() - elapsed
    window: list[dict] = []
    while step < total:
        epoch, pos = divmod(step, len(train_b))
        order = torch.randperm(len(train_b), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch)).tolist()
        batch = collate(train_s, train_b[order[pos]])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, cfg)
        loss, st = head_loss(head, base, batch, cfg, torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        window = (window + [st])[-20:]
        avg = {k: sum(w[k] for w in window) / len(window) for k in ("loss", "v_loss", "p_loss", "acc")}
        elapsed = time.perf_counter() - t_start
        if step % len(train_b) == 0:
            ev = evaluate(head, base, val_s, val_b, cfg) if val_b else {}
            history.append({"epoch": step // len(train_b), "step": step, "train": avg, "val": ev, "elapsed_s": elapsed})
        if on_step:
            on_step(step, total, avg)
        if step % cfg.checkpoint_every == 0 or step == total:
            save_ckpt()
    head.eval().requires_grad_(False)
    summary = {
        "steps": total,
        "draft_vocab": head.cfg.draft_vocab,
        "draft_vocab_coverage": _coverage(val_s or train_s, head.draft_vocab),
        "train_sequences": len(train_s),
        "val_sequences": len(val_s),
        "train_time_s": round(time.perf_counter() - t_start, 1),
        "history": history,
        "final": history[-1] if history else {},
    }
    return head, summary

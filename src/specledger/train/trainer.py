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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig, draft_lm_head
from specledger.engine.cpu_ops import apply_rope, causal_mask, masked_attention
from specledger.engine.loader import LoadedModel
from specledger.engine.model import Block
from specledger.engine.ragged import rope_at
from specledger.errors import BadInput
from specledger.train.data import Sample


@dataclass
class TrainConfig:
    epochs: int = 8
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
    draft_vocab: int = 8192  # most frequent tokens the head may propose; 0 = the whole vocabulary
    labels: str = "hard"  # "hard": the target's tokens; "soft": the target's distribution (from its features)
    prompt_loss: bool = False  # also learn on prompt positions (needs soft labels: the target did not write them)
    unroll: int = 1  # steps fed the head's own predictions (1 = EAGLE-1; more trains deeper tree levels)

    def __post_init__(self) -> None:  # refused before the target spends minutes answering prompts
        if self.labels not in ("hard", "soft") or self.unroll < 1:
            raise BadInput(f"labels must be hard or soft and unroll >= 1 (got {self.labels!r}, {self.unroll})")
        if self.prompt_loss and self.labels != "soft":
            raise BadInput("learning on prompt positions needs soft labels (the target did not write the prompt)")


@dataclass
class Batch:
    tokens: torch.Tensor  # (B, L)
    features: torch.Tensor  # (B, L - 1, H)
    mask: torch.Tensor  # (B, L - 2): entries that count in the loss
    answer: torch.Tensor  # (B, L - 2): entries whose next token the target generated


def make_batches(samples: list[Sample], batch_tokens: int) -> list[list[int]]:
    """Sequences sorted by length, chunked so each batch pads to at most batch_tokens."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].tokens))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * len(samples[i].tokens) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def collate(samples: list[Sample], idx: list[int], prompt_loss: bool = False) -> Batch:
    seqs = [samples[i] for i in idx]
    L = max(len(s.tokens) for s in seqs)
    H = seqs[0].features.shape[1]
    toks = torch.zeros(len(seqs), L, dtype=torch.long)
    feats = torch.zeros(len(seqs), L - 1, H)
    answer = torch.zeros(len(seqs), max(L - 2, 0), dtype=torch.bool)
    mask = answer.clone()
    for b, s in enumerate(seqs):
        n = len(s.tokens)
        toks[b, :n] = torch.tensor(s.tokens)
        feats[b, : n - 1] = s.features.float()
        answer[b, max(s.prompt_len - 2, 0) : max(n - 2, 0)] = True
        mask[b, 0 if prompt_loss else max(s.prompt_len - 2, 0) : max(n - 2, 0)] = True
    return Batch(toks, feats, mask, answer)


def pick_draft_vocab(samples: list[Sample], size: int, vocab_size: int, always: Sequence[int] = ()) -> torch.Tensor | None:
    """The `size` tokens seen most often in the data (plus `always`), sorted; None = everything.

    Unseen tokens are ranked by id: BPE vocabularies give common merges low ids.
    """
    if size <= 0 or size >= vocab_size:
        return None
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in samples:
        counts += torch.bincount(torch.tensor(s.tokens, dtype=torch.long), minlength=vocab_size).double()
    counts[list(always)] = counts.max() + 1
    score = counts * vocab_size + (vocab_size - torch.arange(vocab_size, dtype=torch.float64))
    return score.topk(size).indices.sort().values


def _shift(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[:, k:] padded with zeros back to x's length (dim 1)."""
    if k == 0:
        return x
    return torch.cat([x[:, k:], x.new_zeros(x.shape[0], k, *x.shape[2:])], dim=1)


def unroll_mask(n: int, step: int, start: int = 0) -> torch.Tensor:
    """Entry i of unroll step `step` (>= 2) sees the true-feature entries 0..i and its own chain i.

    That is what a depth-`step - 1` tree node sees when drafting: the committed entries, its
    ancestors (fed the head's own predictions) and itself. Steps >= 2 hold entries start..n-1.
    """
    m = n - start
    mask = torch.zeros(m, n + (step - 1) * m, dtype=torch.bool)
    mask[:, :n] = torch.ones(n, n, dtype=torch.bool).tril()[start:]
    eye = torch.eye(m, dtype=torch.bool)
    for t in range(1, step):
        mask[:, n + (t - 1) * m : n + t * m] = eye
    return mask


class GrowingCache:
    """The head's KV entries in training: concatenated, never written in place, so autograd can go back through
    every unroll step (the engine's SlotCache overwrites a preallocated buffer)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def train_layer(block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: GrowingCache,
                mask: torch.Tensor) -> torch.Tensor:
    """The head's decoder layer for training only, x (B, n, hidden) under mask (n, cached + n): the ops of the
    engine's layer (engine/model.py: ragged_block, which drafting runs) on a cache that grows by concatenation,
    so gradients reach every unroll step; ragged_block writes its cache in place, which autograd refuses."""
    a = block.attention
    b, n, _ = x.shape
    h = block.attention_norm(x)
    qkv = a.project(h)
    qk_out = a.split[0] + a.split[1]
    qk = apply_rope(qkv[..., :qk_out].view(b, n, a.n_heads + a.n_kv, a.hd), cos, sin)
    v = qkv[..., qk_out:].view(b, n, a.n_kv, a.hd).transpose(1, 2)
    keys, values = cache.append(qk[:, :, a.n_heads :].transpose(1, 2), v)
    y = masked_attention(qk[:, :, : a.n_heads].transpose(1, 2), keys, values, mask)
    x = a.wo.add_to(y.transpose(1, 2).reshape(b, n, -1).to(h.dtype), x)
    return block.feed_forward(block.ffn_norm(x), x)


def train_hidden(head: EagleHead, base: LoadedModel, tokens: torch.Tensor, features: torch.Tensor,
                 cache: GrowingCache, positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """The head through train_layer: n entries (B, n) on top of the cache, default consecutive and causal."""
    n, start = tokens.shape[1], cache.length
    pos = torch.arange(start, start + n, device=tokens.device) if positions is None else positions
    cos, sin = rope_at(base.model.rope_cos, base.model.rope_sin, pos, head.dtype)
    mask = causal_mask(start, n, tokens.device) if mask is None else mask
    x = train_layer(head.block, head.inputs(base.model, tokens, features), cos, sin, cache, mask)
    cache.length = start + n
    return x.to(head.dtype)


def unrolled(head: EagleHead, base: LoadedModel, tokens: torch.Tensor, f_in: torch.Tensor, steps: int,
             start: int = 0) -> list[torch.Tensor]:
    """The head's predicted features at each unroll step over whole sequences (B, L).

    Step 1, entry i: (f_i, token i+1) at position i, causal (EAGLE-1): (B, L - 2, H). Step s,
    entry i: (the step s-1 prediction at i, token i+s) at position i+s-1, seeing what a depth
    s-1 tree node sees; only entries start.. are computed there (B, L - 2 - start, H).
    """
    n = tokens.shape[1] - 2
    cache = GrowingCache()
    h, out = f_in, []
    for step in range(1, steps + 1):
        toks = _shift(tokens[:, 1 : n + 1], step - 1)
        if step == 1:
            h = train_hidden(head, base, toks, h, cache)
        else:
            h = h[:, start:] if step == 2 else h
            pos = torch.arange(start, n) + step - 1
            h = train_hidden(head, base, toks[:, start:], h, cache, pos, unroll_mask(n, step, start))
        out.append(h)
    return out


def head_loss(head: EagleHead, base: LoadedModel, batch: Batch, cfg: TrainConfig,
              gen: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """EAGLE-1 loss on one batch, averaged over `cfg.unroll` steps in which the head is fed its
    own predicted features; also the head's top-1 agreement with the target's answer tokens."""
    B, L = batch.tokens.shape
    n = L - 2
    f_in = batch.features[:, :n]
    if cfg.noise > 0 and head.training:
        f_in = f_in + (torch.rand(f_in.shape, generator=gen) - 0.5) * cfg.noise
    lm_head = draft_lm_head(head, base.model)
    index = None
    if head.draft_vocab is not None and cfg.labels == "hard":
        index = torch.full((base.config.vocab_size,), -100, dtype=torch.long)
        index[head.draft_vocab] = torch.arange(head.draft_vocab.numel())
    total = torch.zeros(())
    stats: dict = {}
    cols = batch.mask.any(0).nonzero()
    start = max(0, int(cols[0]) - cfg.unroll) if cols.numel() else 0  # steps >= 2 skip what no loss needs
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
        hs = unrolled(head, base, batch.tokens, f_in, cfg.unroll, start)
    for step, h in enumerate(hs, 1):
        k = step - 1
        first = 0 if step == 1 else start
        m = _shift(batch.mask, k)[:, first:]
        if not bool(m.any()):
            break
        ans = _shift(batch.answer, k)[:, first:][m]
        f_next = _shift(batch.features[:, 1 : L - 1], k)[:, first:][m]
        target = _shift(batch.tokens[:, 2:L], k)[:, first:][m]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
            h_sel = h[m]
            logits = lm_head(h_sel).float()
            if cfg.labels == "soft":
                with torch.no_grad():
                    p_target = torch.softmax(lm_head(f_next).float(), dim=-1)
        v_loss = F.smooth_l1_loss(h_sel.float(), f_next)
        guess = logits.argmax(-1)
        if head.draft_vocab is not None:
            guess = head.draft_vocab[guess]
        if cfg.labels == "soft":
            p_loss = -(p_target * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        elif index is not None:  # targets outside the draft vocabulary cannot be learned: ignored
            mapped = index[target]
            p_loss = F.cross_entropy(logits, mapped, ignore_index=-100) if bool((mapped >= 0).any()) else logits.sum() * 0
        else:
            p_loss = F.cross_entropy(logits, target)
        total = total + (v_loss + cfg.p_weight * p_loss) / cfg.unroll
        acc = (guess == target)[ans].float().mean().item() if bool(ans.any()) else 0.0
        if step == 1:
            stats = {"v_loss": v_loss.item(), "p_loss": p_loss.item(), "acc": acc, "n": int(m.sum()),
                     "n_answer": int(ans.sum())}
        else:
            stats[f"acc{step}"] = acc
    stats = {"loss": total.item(), "v_loss": 0.0, "p_loss": 0.0, "acc": 0.0, "n": 0, "n_answer": 0} | stats
    return total, stats


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
        for k in st:
            if k not in ("n", "n_answer"):
                tot[k] = tot.get(k, 0.0) + st[k] * st["n_answer"]
        n += st["n_answer"]
    head.train()
    return {k: v / max(n, 1) for k, v in tot.items()}


def train_head(base: LoadedModel, samples: list[Sample], cfg: TrainConfig, work_dir: str | Path, *,
               resume: bool = False, data_key: str = "",
               on_step: Callable[[int, int, dict], None] | None = None) -> tuple[EagleHead, dict]:
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

    t_start = time.perf_counter() - elapsed
    window: list[dict] = []
    while step < total:
        epoch, pos = divmod(step, len(train_b))
        order = torch.randperm(len(train_b), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch)).tolist()
        batch = collate(train_s, train_b[order[pos]], cfg.prompt_loss)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, cfg)
        loss, st = head_loss(head, base, batch, cfg, torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
        opt.zero_grad(set_to_none=True)
        if loss.requires_grad:  # a batch may hold no answer positions
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
            opt.step()
        step += 1
        window = (window + [st])[-20:]
        avg = {k: sum(w.get(k, 0.0) for w in window) / len(window) for k in st if k not in ("n", "n_answer")}
        elapsed = time.perf_counter() - t_start
        if step % len(train_b) == 0:
            ev = evaluate(head, base, val_s, val_b, cfg) if val_b else {}
            history.append({"epoch": step // len(train_b), "step": step, "train": avg, "val": ev, "elapsed_s": elapsed})
        if on_step:
            on_step(step, total, avg)
        if step % cfg.checkpoint_every == 0 or step == total:  # written aside, then moved into place
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                        "history": history, "config": asdict(cfg), "data_key": data_key}, ckpt_path.with_suffix(".tmp"))
            ckpt_path.with_suffix(".tmp").rename(ckpt_path)
    head.eval().requires_grad_(False)
    return head, {"steps": total, "draft_vocab": head.cfg.draft_vocab,
                  "draft_vocab_coverage": _coverage(val_s or train_s, head.draft_vocab),
                  "train_sequences": len(train_s), "val_sequences": len(val_s),
                  "train_time_s": round(time.perf_counter() - t_start, 1), "history": history,
                  "final": history[-1] if history else {}}

"""generate(): target prefill, drafter prefill, then strategy steps until a stop condition."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specledger.decoding.cached_model import CachedModel
from specledger.decoding.sampling import SamplingParams, probs_from_logits, sample
from specledger.decoding.strategy import Context, LevelStats, Strategy, clock
from specledger.errors import BadInput

OnTokens = Callable[[list[int], float], None]


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    ttft_s: float  # request start -> first token, every prefill included
    prefill_s: float  # the target's prefill
    draft_prefill_s: float  # drafters' and intermediates' prefill
    total_s: float
    token_times: list[float]  # clock() time (perf_counter) each output token became available
    steps: int  # target verification steps after the first token
    appended: int = 0  # tokens those steps produced (before any truncation at a stop)
    levels: list[LevelStats] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    strategy: str = ""
    params: dict = field(default_factory=dict)
    cached_tokens: int = 0  # prompt tokens whose cache entries an earlier request left (the prefix cache)

    @property
    def tau(self) -> float | None:
        """Mean tokens appended per target verification step, bonus included (AR = 1)."""
        return self.appended / self.steps if self.steps else None

    @property
    def decode_tok_s(self) -> float | None:
        n, dt = len(self.token_ids) - 1, self.total_s - self.ttft_s
        return n / dt if n > 0 and dt > 0 else None

    @property
    def e2e_tok_s(self) -> float:
        return len(self.token_ids) / self.total_s if self.total_s > 0 else 0.0

    def stats(self) -> dict:
        return {
            "strategy": self.strategy,
            "params": self.params,
            "steps": self.steps,
            "tau": self.tau,
            "levels": [lv.model_dump() for lv in self.levels],
            "ttft_s": self.ttft_s,
            "prefill_s": self.prefill_s,
            "draft_prefill_s": self.draft_prefill_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "total_s": self.total_s,
        }


def _stop_cut(tok, ids: list[int], stops: list[str]) -> tuple[list[int], str] | None:
    """If a stop string appeared, the shortest token prefix that contains it and the text before it."""
    text = tok.decode(ids)
    hits = [text.find(s) for s in stops if s and s in text]
    if not hits:
        return None
    cut = min(hits)
    for i in range(1, len(ids) + 1):
        if len(tok.decode(ids[:i])) > cut:
            return ids[:i], text[:cut]
    return ids, text[:cut]


def generate(
    strategy: Strategy,
    prompt_ids: list[int],
    sp: SamplingParams | None = None,
    on_tokens: OnTokens | None = None,
) -> GenerationResult:
    sp = sp or SamplingParams()
    lm = strategy.target
    ctx_len = lm.config.max_seq_len
    if not prompt_ids:
        raise BadInput("empty prompt")
    if len(prompt_ids) >= ctx_len:
        raise BadInput(f"prompt of {len(prompt_ids)} tokens does not fit the context of {ctx_len} tokens")
    max_len = min(ctx_len, len(prompt_ids) + sp.max_new_tokens + strategy.lookahead + 1)
    max_new = min(sp.max_new_tokens, ctx_len - len(prompt_ids))
    tok = lm.tokenizer
    eos = set() if sp.ignore_eos else set(lm.config.eos_ids)
    gen = None if sp.greedy else sp.generator()

    dev = lm.model.device
    t0 = clock(dev)
    target = CachedModel(lm, max_len)
    logits = target.prefill(prompt_ids)
    first = int(logits.argmax()) if gen is None else sample(probs_from_logits(logits, sp), gen)  # None: greedy
    t1 = clock(target.device)
    target.tokens.append(first)
    ctx = Context(target, list(prompt_ids), sp, gen)
    strategy.start(ctx)
    t2 = clock(target.device)
    levels = [LevelStats(name=n, steps=0, drafts=0, time_s=0.0) for n in strategy.level_names]
    out: list[int] = []
    times: list[float] = []
    finish = "length"
    steps, appended, verify_s = 0, 0, 0.0
    text: str | None = None
    new = [first]
    now = t2
    while True:
        stop_at = next((i for i, t in enumerate(new) if t in eos and len(out) + i >= sp.min_new_tokens), None)
        if stop_at is not None:
            new, finish = new[:stop_at], "stop"
        new = new[: max_new - len(out)]
        out.extend(new)
        times.extend([now] * len(new))
        if on_tokens and new:
            on_tokens(new, now)
        if sp.stop and tok is not None and (cut := _stop_cut(tok, out, sp.stop)) is not None:
            out, text, finish = cut[0], cut[1], "stop"
            break
        if finish == "stop" or len(out) >= max_new:
            break
        before = len(target.tokens)
        st = strategy.step(ctx)
        now = clock(dev)
        steps += 1
        appended += st.appended
        verify_s += st.verify_s
        for lv, checks, s in zip(levels, st.verifications, st.level_s):
            for p, a in checks:
                lv.observe(p, a)
            lv.time_s = (lv.time_s or 0.0) + s
        new = target.tokens[before:]
    if text is None:
        text = tok.decode(out) if tok is not None else ""
    times = times[: len(out)]
    total = clock(dev) - t0
    return GenerationResult(
        token_ids=out,
        text=text,
        finish_reason=finish,
        prompt_tokens=len(prompt_ids),
        ttft_s=t2 - t0,
        prefill_s=t1 - t0,
        draft_prefill_s=t2 - t1,
        total_s=total,
        token_times=times,
        steps=steps,
        appended=appended,
        levels=levels,
        draft_s=sum(lv.time_s or 0.0 for lv in levels),
        verify_s=verify_s,
        strategy=strategy.name,
        params=strategy.params(),
    )

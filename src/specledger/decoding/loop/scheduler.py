"""Continuous batching: many requests decoded together, joining and leaving at every step.

Each `step()` admits waiting requests into free cache slots (up to max_batch running),
then runs ONE pass of the target over every running sequence: one row per decoding
sequence (its pending token, plus its draft tree once speculation is batched) and a chunk
of the prompt for sequences still prefilling (at most `prefill_chunk` prompt rows per
pass in all, so a long prompt does not stall the others for long). Finished and cancelled
requests leave at the end of the step and free their slot.

Every request keeps its own sampling parameters and random generator, so its tokens are those it would get
alone (the same verifier, the same draws); stops (eos, stop strings, max tokens) are the engine's only copy of
them (generate() is this scheduler holding one request). Timing is per request: queue time, TTFT from arrival
(queue and every prefill chunk included), and the time each token became available.

With a drafter (drafters/base.py), each step's drafts are sized by its draft_length policy (sizing/policy.py) and
proposed for every decoding sequence at once (loop/speculation.py); the pass verifies them all with the one
verifier. The prefix cache (on by default, as in llama-server and vLLM) is the runner's (loop/runner.py).

Failure isolation: an exception in one request's part of a step (admission: its slot, its seed's
generator; its first token, its verification, its drafter's bookkeeping, its callbacks, its retirement)
ends that request alone with finish_reason "error"; the others go on. Only an exception in the shared
pass itself, which cannot be told apart, reaches step()'s caller (SchedulerThread fails that pass's requests).

Thread safety: add() and cancel() may be called from any thread; step() from one.
Callbacks (on_tokens, on_done) run on the stepping thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specledger.decoding.loop.runner import RunForward, RunItem, ModelRunner, Sequence
from specledger.decoding.loop.speculation import Speculation, DraftState
from specledger.decoding.sizing.planner import CostSurface
from specledger.decoding.drafters.base import Drafter
from specledger.decoding.sampling import SamplingParams, probs_from_logits, sample
from specledger.decoding.tree import Tree
from specledger.decoding.verify import verify
from specledger.engine.loader import LoadedModel
from specledger.engine.timing import clock
from specledger.engine.tokenizer import Tokenizer
from specledger.errors import BadInput
from specledger.spec_stats import LevelStats


OnTokens = Callable[[list[int], float], None]


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" (a scheduled request also "cancelled" | "error")
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


@dataclass
class ScheduledResult(GenerationResult):
    """A GenerationResult with the queue: ttft_s and total_s count from arrival."""

    request_id: int = 0
    arrival: float = 0.0  # perf_counter time of add()
    queue_s: float = 0.0  # arrival -> admitted into the batch
    mean_batch: float = 0.0  # mean number of sequences in the passes this request took part in
    error: str | None = None  # finish_reason "error": this request's part of a step failed, or the shared pass
    exception: Exception | None = field(default=None, repr=False, compare=False)  # what failed it, when one raised


def _stop_cut(tok: Tokenizer, ids: list[int], stops: list[str]) -> tuple[list[int], str] | None:
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


OnDone = Callable[[ScheduledResult], None]


@dataclass
class _Live:
    rid: int
    prompt: list[int]
    sp: SamplingParams
    on_tokens: OnTokens | None
    on_done: OnDone | None
    arrival: float
    max_tokens: int  # sp.max_tokens, within the context left after the prompt
    eos: set[int]
    gen: torch.Generator | None = None  # set on admission when sampling
    seq: Sequence | None = None
    admitted: float = 0.0
    first_at: float | None = None
    out: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    text: str | None = None
    finish: str | None = None
    steps: int = 0
    appended: int = 0
    verify_s: float = 0.0
    passes: int = 0
    batch_sum: int = 0
    error: str | None = None
    exception: Exception | None = None
    draft: DraftState | None = None  # batched speculation, from the first token on

    @property
    def prefilling(self) -> bool:
        return self.first_at is None

    def fail(self, exc: Exception) -> None:
        """This request (alone) ends with reason "error" at the end of the step."""
        self.finish, self.error, self.exception = "error", f"{type(exc).__name__}: {exc}", exc

    @property
    def running_seq(self) -> Sequence:
        """The sequence of a running request (opened on admission, closed on retirement)."""
        assert self.seq is not None
        return self.seq

    def first_token(self, logits: torch.Tensor) -> int:
        if self.sp.greedy:
            return int(logits.argmax())
        assert self.gen is not None  # admission gives every sampled request its generator
        return sample(probs_from_logits(logits, self.sp), self.gen)

    def emit(self, new: list[int], now: float, tok: Tokenizer | None) -> None:
        """Append a step's tokens under the stop rules (eos after min tokens, max tokens, stop strings)."""
        sp = self.sp
        stop_at = next((i for i, t in enumerate(new) if t in self.eos and len(self.out) + i >= sp.min_tokens), None)
        if stop_at is not None:
            new, self.finish = new[:stop_at], "stop"
        new = new[: self.max_tokens - len(self.out)]
        self.out.extend(new)
        self.times.extend([now] * len(new))
        if self.on_tokens and new:
            self.on_tokens(new, now)
        if sp.stop and tok is not None and (cut := _stop_cut(tok, self.out, sp.stop)) is not None:
            self.out, self.text, self.finish = cut[0], cut[1], "stop"
            self.times = self.times[: len(self.out)]
        elif self.finish is None and len(self.out) >= self.max_tokens:
            self.finish = "length"


# prompt rows a pass takes when one request prefills alone, in `specledger bench` (bench/backends/inprocess.py): 8x the
# default chunk; a 4k-token prompt in 2 passes instead of 16
SOLO_PREFILL_CHUNK = 2048


class Scheduler:
    """Continuous batching over one target model, autoregressive or with a drafter (module docstring).

    drafter: None (autoregressive) or a Drafter (decoding/drafters/base.py) made for max_batch sequences; cost: the
    verification-cost surface to plan drafts with (default: measured for this model on construction, kept
    in the model pool); prefix_cache: reuse cached prompt prefixes across requests (module docstring);
    draft_length: how each step's drafts are sized, "adaptive" (the planner) or "fixed" (sizing/policy.py);
    solo_prefill_chunk: prompt rows per pass when one request is running, still prefilling, and none waits (None:
    prefill_chunk always). The chunk limit keeps a long prompt from stalling others; alone, it only costs passes: each
    pass is a fixed cost (a few ms of launches and OpenMP regions per layer), its products run closer to their peak
    shape with more rows, and a prompt that fits one chunk attends from an empty cache (causal, no mask, one read of
    its keys). A request arriving meanwhile waits for that one pass.
    """

    def __init__(self, lm: LoadedModel, *, max_batch: int = 8, prefill_chunk: int = 256,
                 max_len: int | None = None, drafter: Drafter | None = None,
                 cost: CostSurface | Callable[[int], float] | None = None, prefix_cache: bool = True,
                 draft_length: str = "adaptive", solo_prefill_chunk: int | None = None) -> None:
        if max_batch < 1:
            raise BadInput(f"max_batch must be >= 1 (got {max_batch})")
        if prefill_chunk < 1:
            raise BadInput(f"prefill_chunk must be >= 1 (got {prefill_chunk})")
        self.solo_prefill_chunk = max(prefill_chunk, solo_prefill_chunk or 0)
        self.lm = lm
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = prefix_cache
        self.runner = ModelRunner(lm, max_batch, max_len, prefix_cache=prefix_cache,
                                  keep_features=drafter is not None and drafter.wants_features)
        self._lock = threading.Lock()
        self._waiting: deque[_Live] = deque()
        self._cancel: set[int] = set()
        self._running: list[_Live] = []
        self._next_id = 0
        self.last_batch = 0  # sequences in the latest pass (a gauge for /metrics)
        self.last_rows = 0  # rows (tokens) in the latest pass
        self.drafter = drafter
        self.spec = None if drafter is None else Speculation(lm, drafter, max_batch, cost, draft_length)

    # ---- any thread ---------------------------------------------------------------------------
    def add(self, prompt_ids: list[int], sp: SamplingParams | None = None, *,
               on_tokens: OnTokens | None = None, on_done: OnDone | None = None) -> int:
        """Queue a request; returns its id. A prompt that cannot run raises BadInput here."""
        sp = sp or SamplingParams()
        ctx_len = min(self.lm.config.max_seq_len, self.runner.max_len)
        if not prompt_ids:
            raise BadInput("empty prompt")
        if len(prompt_ids) >= ctx_len:
            raise BadInput(f"prompt of {len(prompt_ids)} tokens does not fit the context of {ctx_len} tokens")
        eos = set() if sp.ignore_eos else set(self.lm.config.eos_ids)
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self._waiting.append(_Live(rid, list(prompt_ids), sp, on_tokens, on_done, time.perf_counter(),
                                       min(sp.max_tokens, ctx_len - len(prompt_ids)), eos))
        return rid

    def cancel(self, rid: int) -> None:
        """Stop a request at the next step; it finishes with finish_reason "cancelled" and what it has."""
        with self._lock:
            self._cancel.add(rid)

    @property
    def strategy_name(self) -> str:
        return "ar" if self.drafter is None else self.drafter.name

    def params(self) -> dict:
        """What a result reports as its strategy's parameters."""
        batch = {"max_batch": self.max_batch, "prefill_chunk": self.prefill_chunk, "prefix_cache": self.prefix_cache}
        if self.solo_prefill_chunk > self.prefill_chunk:
            batch["solo_prefill_chunk"] = self.solo_prefill_chunk
        if self.drafter is None:
            return batch
        assert self.spec is not None
        return {**self.drafter.params(), **batch, "draft_length": self.spec.policy.name}

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    @property
    def n_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def has_cancels(self) -> bool:
        return bool(self._cancel)

    # ---- the stepping thread ------------------------------------------------------------------
    def step(self) -> list[ScheduledResult]:
        """Admit, run one pass over every running sequence, retire; the requests finished."""
        finished = self._admit_and_cancel()
        t0 = time.perf_counter()
        items: list[RunItem] = []
        live_in: list[_Live] = []
        alone = len(self._running) == 1 and self._running[0].prefilling and not self._waiting
        budget = self.solo_prefill_chunk if alone else self.prefill_chunk
        runs: dict[int, int] = {}
        decoding: list[_Live] = []
        for lv in self._running:
            if lv.prefilling:
                if budget <= 0:
                    continue
                n = min(len(lv.running_seq.tokens) - self.runner.cached(lv.running_seq), budget)
                budget -= n
                runs[lv.rid] = n
            else:
                decoding.append(lv)
        chains = self._drafts(decoding, sum(runs.values())) if self.spec and decoding else {}
        for lv in self._running:
            if lv.rid in runs:
                items.append(RunItem(lv.running_seq, max_run=runs[lv.rid]))
            elif not lv.prefilling:
                items.append(RunItem(lv.running_seq, chains.get(lv.rid) or Tree()))
            else:
                continue
            live_in.append(lv)
        if not items:
            return finished
        self.last_batch = len(items)
        t_fwd = clock(self.runner.device)
        fwds = self.runner.forward(items)
        t_fwd = clock(self.runner.device) - t_fwd  # (clock waits for the device: the pass, not its launch)
        self.last_rows = sum(f.hidden.shape[0] for f in fwds)
        emitted: list[tuple[_Live, list[int]]] = []
        for lv, it, fwd in zip(live_in, items, fwds):
            if fwd.logits is None:  # a prefill chunk that did not reach the prompt's end
                continue
            try:  # sampling, verifying, drafting: one request's failure is its own
                emitted.append((lv, self._advance(lv, it, fwd)))
            except Exception as exc:  # noqa: BLE001 - fail this request alone; the batch goes on
                lv.fail(exc)
        now = clock(self.runner.device)
        if self.spec is not None and decoding and not runs:  # (a prefill's pass also begins drafters: not measured)
            self.spec.observe(time.perf_counter() - t0, t_fwd, self.last_rows, len(decoding), len(chains))
        for lv in live_in:
            lv.passes += 1
            lv.batch_sum += len(items)
            if not lv.prefilling:
                lv.verify_s += now - t0
        for lv, new in emitted:
            if lv.first_at is None:
                lv.first_at = now
            try:  # the stop rules and the caller's on_tokens
                lv.emit(new, now, self.lm.tokenizer)
            except Exception as exc:  # noqa: BLE001 - fail this request alone
                lv.fail(exc)
        return finished + self._retire_finished(now)

    def _retire_finished(self, now: float) -> list[ScheduledResult]:
        """The running requests that finished leave the batch, in its order."""
        done = [lv for lv in self._running if lv.finish is not None]
        self._running = [lv for lv in self._running if lv.finish is None]
        return [_retire(self, lv, now) for lv in done]

    def _advance(self, lv: _Live, it: RunItem, fwd: RunForward) -> list[int]:
        """One request's share of a pass: its first token, or its verified draft; the tokens it gains."""
        assert fwd.logits is not None  # (the caller skips prefill chunks short of the prompt's end)
        if lv.prefilling:
            first = lv.first_token(fwd.logits[0])
            lv.running_seq.tokens.append(first)
            if self.spec is not None:
                feats = self.runner.features(lv.running_seq) if self.spec.drafter.wants_features else None
                lv.draft = self.spec.begin(lv.rid, lv.running_seq.tokens, lv.sp, lv.gen, feats,
                                           (self.runner.cache, lv.running_seq.slot))
            return [first]
        assert it.tree is not None  # a decoding item always carries a tree (maybe empty)
        verdict = verify(fwd.logits, it.tree, lv.sp, lv.gen)
        new = verdict.tokens(it.tree)
        feats = self.runner.accept(lv.running_seq, fwd, verdict.path, new)
        if lv.draft is not None and self.spec is not None:
            self.spec.accepted(lv.draft, lv.running_seq.tokens, it.tree, verdict.path, feats)
        lv.steps += 1
        lv.appended += len(new)
        return new

    def _drafts(self, decoding: list[_Live], prefill_rows: int) -> dict[int, Tree]:
        """Each decoding sequence's draft for this pass, sized by the planner (empty: none)."""
        states = [lv.draft for lv in decoding if lv.draft is not None]  # begun when its first token was drawn
        assert self.spec is not None and len(states) == len(decoding)
        caps = [max(0, min(self.runner.room(lv.running_seq), lv.max_tokens - len(lv.out) - 1)) for lv in decoding]
        return {lv.rid: t for lv, t in zip(decoding, self.spec.plan(states, caps, prefill_rows)) if len(t)}

    def abort(self, error: str, *, waiting: bool = True) -> list[ScheduledResult]:
        """Fail the running requests (a pass raised: which one caused it cannot be told), and the waiting ones
        too unless waiting=False: each finishes with reason "error"."""
        now = time.perf_counter()
        victims: list[_Live] = []
        if waiting:
            with self._lock:
                victims, self._waiting = list(self._waiting), deque()
        victims = self._running + victims
        self._running = []
        out = []
        for lv in victims:
            lv.finish, lv.error = "error", error
            out.append(_retire(self, lv, now))
        return out

    def _admit_and_cancel(self) -> list[ScheduledResult]:
        finished: list[ScheduledResult] = []
        now = time.perf_counter()
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            if cancel:
                for lv in [w for w in self._waiting if w.rid in cancel]:
                    self._waiting.remove(lv)
                    lv.finish = "cancelled"
                    finished.append(_retire(self, lv, now))
            admit: list[_Live] = []
            while self._waiting and len(self._running) + len(admit) < self.max_batch:
                admit.append(self._waiting.popleft())
        for lv in self._running:
            if lv.rid in cancel:
                lv.finish = "cancelled"
        finished += self._retire_finished(now)
        for lv in admit:
            lv.admitted = now
            try:  # a request that cannot start (its seed, its slot) fails alone
                lv.seq = self.runner.open(lv.prompt)
                lv.gen = None if lv.sp.greedy else lv.sp.generator()
            except Exception as exc:  # noqa: BLE001
                lv.fail(exc)
                finished.append(_retire(self, lv, now))
                continue
            self._running.append(lv)
        return finished


def _retire(sched: Scheduler, lv: _Live, now: float) -> ScheduledResult:
    """Close the request's slot and hand its result on; a failure here fails this request alone. (Module
    functions over the scheduler: they keep the Scheduler class to its loop.)"""
    try:
        return _result(sched, lv, now)
    except Exception as exc:  # noqa: BLE001 - still answer it: an error result, its slot dropped
        lv.fail(exc)
        if lv.seq is not None:
            try:
                sched.runner.close(lv.seq, keep=False)
            except Exception:  # noqa: BLE001 - the slot is beyond repair; the result still goes out
                pass
            lv.seq = None
        res = ScheduledResult(token_ids=lv.out, text="", finish_reason="error", prompt_tokens=len(lv.prompt),
                              ttft_s=0.0, prefill_s=0.0, draft_prefill_s=0.0, total_s=now - lv.arrival,
                              token_times=lv.times, steps=lv.steps, strategy=sched.strategy_name,
                              request_id=lv.rid, arrival=lv.arrival, error=lv.error, exception=lv.exception)
        if lv.on_done:
            try:
                lv.on_done(res)
            except Exception:  # noqa: BLE001 - its caller's hook failed twice: nothing more to tell it
                pass
        return res


def _result(sched: Scheduler, lv: _Live, now: float) -> ScheduledResult:
    """The request's result, its slot closed (its entries kept for the prefix cache unless it failed)."""
    cached = lv.seq.reused if lv.seq is not None else 0
    if lv.seq is not None:
        sched.runner.close(lv.seq, keep=lv.error is None)
        lv.seq = None
    levels: list[LevelStats] = []
    draft_prefill_s = draft_s = 0.0
    if sched.spec is not None:
        if lv.draft is not None:
            draft_prefill_s, draft_s = lv.draft.prefill_s, lv.draft.draft_s
            levels = sched.spec.end(lv.draft)
            lv.draft = None
        else:  # finished (or failed) before its first token
            levels = [*sched.spec.inner_levels(None), LevelStats(name=sched.spec.drafter.name, steps=0, drafts=0)]
    tok = sched.lm.tokenizer
    text = lv.text if lv.text is not None else (tok.decode(lv.out) if tok is not None else "")
    admitted = lv.admitted or now
    first = lv.first_at if lv.first_at is not None else now
    res = ScheduledResult(
        token_ids=lv.out, text=text, finish_reason=lv.finish or "cancelled", prompt_tokens=len(lv.prompt),
        cached_tokens=cached, ttft_s=first - lv.arrival, prefill_s=first - admitted - draft_prefill_s,
        draft_prefill_s=draft_prefill_s, total_s=now - lv.arrival,
        token_times=lv.times, steps=lv.steps, appended=lv.appended, levels=levels, draft_s=draft_s,
        verify_s=lv.verify_s, strategy=sched.strategy_name, params=sched.params(),
        request_id=lv.rid, arrival=lv.arrival, queue_s=admitted - lv.arrival,
        mean_batch=lv.batch_sum / lv.passes if lv.passes else 0.0, error=lv.error, exception=lv.exception,
    )
    if lv.on_done:
        lv.on_done(res)
    return res

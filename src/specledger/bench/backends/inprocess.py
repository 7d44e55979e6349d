"""The native engine in this process: the continuous-batching scheduler, stepped by a worker thread.

Concurrency N means N sequences in one pass (up to max_batch; more wait in its queue), so open-loop arrivals
keep their schedule; a drafting strategy sizes each sequence's drafts by its draft_length policy. `batching:
false` is max_batch 1: one request at a time, the others queued (their queueing time is reported, and TTFT
counts from arrival).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch

import specledger
from specledger.bench.backends.base import Backend, Completion
from specledger.records.config import BenchConfig, Sampling
from specledger.bench.energy import EnergyMeter
from specledger.bench.metrics import chunks_from_token_times
from specledger.bench.telemetry import peak_rss_bytes, reset_peak_rss
from specledger.decoding.sampling import SamplingParams
from specledger.engine import threads
from specledger.errors import SpecLedgerError


class InProcessBackend(Backend):
    serial = True

    def __init__(self, config: BenchConfig, *, meter: EnergyMeter | None = None, models: dict | None = None,
                 in_flight: int | None = None):
        """`models` may hold already loaded models by role ("target", "draft", "intermediate"); `in_flight`: the most
        requests the run ever sends at once (bench/memory_plan.in_flight), the slots its KV caches hold (every slot
        grows to the longest sequence: 16 of them at 16k tokens on the 1.5B were 7 GB; a batch never exceeds the
        requests in flight, so fewer slots change no schedule)."""
        super().__init__(config)
        self.slots = config.batch_size if in_flight is None else max(1, min(config.batch_size, in_flight))
        self.meter = meter
        self.models: dict[str, Any] = dict(models or {})
        self.strategy: Any = None
        self._cuda = config.device.startswith("cuda")
        self.worker: Any = None  # the SchedulerThread, once started
        self.serial = config.batch_size == 1

    async def start(self) -> None:
        await asyncio.wrap_future(threads.future(self._load))

    def _load(self) -> None:
        from specledger.decoding.loop.worker import SchedulerThread
        from specledger.decoding.factory import make_strategy
        from specledger.decoding.loop.scheduler import SOLO_PREFILL_CHUNK, Scheduler
        from specledger.engine.loader import load_model

        c = self.config
        for role, spec in (("target", c.target), ("draft", c.draft), ("intermediate", c.intermediate)):
            if spec is not None and role not in self.models:  # not already loaded by the run's model pool
                self.models[role] = load_model(spec.model, dtype=spec.dtype, quant=spec.quant,
                                               group_size=spec.group_size, device=c.device, activations=spec.activations)
        roles = {role: self.models[role] for role in ("draft", "intermediate") if getattr(c, role) is not None}
        if self.models["target"].tokenizer is None:
            raise SpecLedgerError(f"configuration {c.name!r}: model {c.model!r} has no tokenizer")
        try:
            self.strategy = make_strategy(c.strategy, target=self.models["target"], **roles, **c.params.given())
            drafter = self.strategy.batch_drafter(self.slots)
        except SpecLedgerError as exc:
            raise SpecLedgerError(f"configuration {c.name!r}: {exc}") from None
        except ImportError as exc:  # a strategy whose module is not in this build
            raise SpecLedgerError(f"configuration {c.name!r}: strategy {c.strategy!r} is not available "
                                  f"in this build ({exc})") from None
        self.worker = SchedulerThread(Scheduler(self.models["target"], max_batch=self.slots,
                                            prefill_chunk=c.prefill_chunk, drafter=drafter,
                                            prefix_cache=c.prefix_cache,
                                            solo_prefill_chunk=max(c.prefill_chunk, SOLO_PREFILL_CHUNK),
                                            draft_length=self.strategy.draft_length))

    async def close(self) -> None:
        if self.worker is not None:
            await asyncio.to_thread(self.worker.close)
            self.worker = None

    async def verify_curve(self) -> list[dict[str, float]]:
        from specledger.bench.probes import measure_verify_curve

        return await asyncio.wrap_future(threads.future(measure_verify_curve, self.models["target"]))

    def template_tokens(self) -> int | None:
        from specledger.bench.synthetic import template_overhead

        if getattr(self, "_template_tokens", None) is None:
            self._template_tokens = template_overhead(self.models["target"].tokenizer)
        return self._template_tokens

    def describe(self) -> str:
        lm = self.models.get("target")
        label = getattr(lm, "label", self.config.model)
        return f"inprocess specledger {specledger.__version__} torch {torch.__version__} {label}"

    def _cannot_fit(self, lm: Any, messages: list[dict[str, str]]) -> str | None:
        """Why a prompt cannot fit the context whatever its tokens (no token covers more text than the vocabulary's
        longest entry: engine/prompt_bound.py), said before it is tokenized (a 50 MB prompt took 145 s and 8.9 GB
        to be refused after); None where it may fit or the tokenizer has no such bound."""
        from specledger.engine.prompt_bound import text_bound

        if not hasattr(self, "_bound"):
            self._bound = text_bound(getattr(lm.tokenizer, "hf", None))
        if self._bound is None:
            return None
        ctx = lm.config.max_seq_len
        size, most = sum(self._bound.size(m["content"]) for m in messages), self._bound.per_token * (ctx - 1)
        if size <= most:
            return None
        return (f"the prompt has {size:,} {self._bound.unit}, more than a context of {ctx} tokens can hold whatever "
                f"its tokens (at most {self._bound.per_token} a token); refused before tokenizing it")

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int,
                       min_tokens: int | None = None, sampling: Sampling | None = None) -> Completion:
        """Hand the request to the batch worker and await the result; times come from the scheduler (arrival = add)."""
        lm = self.models["target"]
        if (too_long := self._cannot_fit(lm, messages)) is not None:
            now = time.perf_counter()
            return Completion(ok=False, start=now, end=now, error=too_long, error_kind="rejected")
        prompt_ids = lm.tokenizer.chat(messages)  # a model without a chat template is a setup error: raise
        sp = sampling or self.config.sampling
        params = SamplingParams(max_tokens=max_tokens, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                                seed=sp.seed, stop=list(sp.stop), min_tokens=min_tokens or 0)
        if not self.worker.scheduler.has_work():  # peaks are per request where requests do not overlap
            reset_peak_rss()
            if self._cuda:
                torch.cuda.reset_peak_memory_stats()
        e0 = self.meter.read() if self.meter else None
        arrival = time.perf_counter()
        try:
            rid, fut = self.worker.submit(prompt_ids, params)
        except SpecLedgerError as exc:  # e.g. the prompt does not fit the context: this request fails
            return Completion(ok=False, start=arrival, end=time.perf_counter(), error=str(exc),
                              error_kind="rejected", prompt_tokens=len(prompt_ids))
        try:
            result = await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self.worker.cancel(rid)
            raise
        e1 = self.meter.read() if self.meter else None
        start = result.arrival + result.queue_s
        end = result.arrival + result.total_s
        if result.error is not None:
            return Completion(ok=False, start=start, end=end, error=result.error, error_kind="exception",
                              prompt_tokens=len(prompt_ids))
        times = list(result.token_times)
        return Completion(
            ok=True, start=start, end=end, text=result.text, chunks=chunks_from_token_times(times),
            first_token=times[0] if times else None, prompt_tokens=len(prompt_ids),
            output_tokens=len(result.token_ids), token_ids=list(result.token_ids),
            finish_reason=result.finish_reason, steps=result.steps, tau=result.tau,
            levels=[lv.model_copy(deep=True) for lv in result.levels],
            draft_s=result.draft_s, verify_s=result.verify_s, prefill_s=result.prefill_s,
            draft_prefill_s=result.draft_prefill_s, cached_prompt_tokens=result.cached_tokens,
            peak_rss_bytes=peak_rss_bytes(), cuda_max_allocated_bytes=int(torch.cuda.max_memory_allocated()) if self._cuda else None,
            energy_j=(e1 - e0) if e0 is not None and e1 is not None else None,
        )

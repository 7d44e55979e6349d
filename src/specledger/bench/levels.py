"""Load levels and conversations: the requests a configuration gets at one load, and how they are sent.

A level is a closed loop (N conversations in flight), an open loop (Poisson arrivals), a trace replay, or
(concurrency 1, interleaved) request by request with every configuration in a seeded random order per item,
so drift in machine load hits all configurations alike. A conversation runs its turns in order, each
seeing the model's earlier answers; every turn becomes one record.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from rich.progress import Progress

from specledger.bench.backends.base import Backend
from specledger.records.config import QUALITY_LEVEL, BenchConfig, LoadLevel, RunConfig
from specledger.bench.energy import EnergyMeter
from specledger.bench.load import closed_loop, open_loop, replay
from specledger.bench.recorder import RunRecorder
from specledger.records.results import LoadResult, RequestRecord, now
from specledger.bench.steady import ConditionSampler, SteadyStateCheck
from specledger.bench.synthetic import fit_prompt
from specledger.bench.telemetry import telemetry_delta
from specledger.records.question import Question
from specledger.bench.retry import answer_sampling, grade_answer, retries
from specledger.errors import SpecLedgerError

# failures at the connection (not an HTTP answer): after one, the backend is asked whether its server is still there
CONNECTION_FAILURES = frozenset({"connect", "dropped", "disconnected", "protocol"})


class ServerGone(SpecLedgerError):
    """The server went away mid-level: the level stays incomplete (what it measured is kept) for --resume."""


@dataclass
class Level:
    """A load level as it runs: its records, and the quality level's own workload (else the run's)."""

    load: LoadLevel
    records: list[RequestRecord] = field(default_factory=list)
    questions: list[Question] | None = None


def _server_of(bc: BenchConfig) -> str | None:
    """Which server a configuration's /metrics come from: a managed server is its own (its URL is assigned
    at start), else the base URL(s) it names."""
    if bc.openai is None:
        return None
    if bc.openai.server is not None:
        return f"managed:{bc.name}"
    return " ".join(bc.openai.base_urls) or bc.openai.base_url


class Levels:
    def __init__(self, cfg: RunConfig, rec: RunRecorder, questions: list[Question], *, meter: EnergyMeter,
                 progress: Progress, noise_probe: Callable[[str], None]):
        self.cfg = cfg
        self.rec = rec
        self.questions = questions
        self.items_per_pass = cfg.load.num_requests or len(questions)
        self.meter = meter
        self.progress = progress
        self.noise_probe = noise_probe  # called halfway through an interleaved level
        self._task: Any = None

    async def interleaved(self, backends: dict[str, Backend], todo: list[BenchConfig], level: Level,
                          rng: random.Random) -> None:
        """One item under every configuration per block, the configurations in a seeded random order."""
        qs = level.questions or self.questions
        label = level.load.label
        n = len(qs) if level.questions else self.items_per_pass * self.cfg.repeats
        levels = {bc.name: Level(level.load, questions=level.questions) for bc in todo}
        done = {bc.name: self.rec.done_items(bc, label) for bc in todo}
        total = sum(len(qs[i % len(qs)].turns)
                    for bc in todo for i in range(n) if i not in done[bc.name])
        self._task = self.progress.add_task(f"{len(todo)} configurations interleaved {label}", total=total)
        servers = [_server_of(bc) for bc in todo]
        energy: dict[str, float | None] = {bc.name: 0.0 for bc in todo}
        before = {bc.name: await backends[bc.name].scrape_metrics() for bc in todo}
        started = now()
        for i in range(n):
            order = rng.sample(todo, len(todo))
            for slot, bc in enumerate(order):
                if i in done[bc.name]:
                    continue
                e0 = self.meter.read()
                await self.conversation(backends[bc.name], bc, qs[i % len(qs)], item=i, arrival=time.perf_counter(),
                                        level=levels[bc.name], block=i, slot=slot)
                e1 = self.meter.read()
                spent = energy[bc.name]
                energy[bc.name] = None if e0 is None or e1 is None or spent is None else spent + (e1 - e0)
            if i == n // 2 and n > 1:
                self.noise_probe("during")
        after = {bc.name: await backends[bc.name].scrape_metrics() for bc in todo}
        self.rec.sync()
        for bc in todo:
            single = self.rec.single_segment(bc, label, done[bc.name])
            lr = self.rec.load_result(bc, level.load, levels[bc.name].records,
                                      energy=energy[bc.name] if single else None, started=started, interleaved=True)
            # a server shared by several configurations mixes their counters: no per-configuration delta
            if single and (bc.openai is None or servers.count(_server_of(bc)) == 1):
                lr.telemetry, lr.telemetry_levels = telemetry_delta(before[bc.name], after[bc.name])
            self.finish(bc, lr)
        self.progress.update(self._task, completed=total)

    def finish(self, bc: BenchConfig, lr: LoadResult, records: list[RequestRecord] | None = None,
               elapsed_s: float | None = None) -> None:
        """A level's results written; without a progress bar (--no-progress) one line says so, so a long run
        is not silent for an hour. A level's aggregate counts each item's first answer (the records); its retries
        run after (a graded level's tail), so the line adds them and the level's own wall time where it has them."""
        self.rec.finish_level(bc, lr)
        if self.progress.disable:
            a = lr.aggregate
            said = [f"{a.requests_ok} requests ok"] + ([f"{a.requests_failed} failed"] if a.requests_failed else []) \
                + [f"{a.output_tokens:,} tokens"] + ([f"{a.output_tok_s:.1f} tok/s"] if a.output_tok_s else []) \
                + ([f"passed {a.passed}/{a.graded}"] if a.graded else [])
            records = records or []
            retried = [r for r in records if len(r.task_attempts) > 1]
            if retried:
                tokens = sum(x.output_tokens for r in records for x in r.task_attempts)
                said.append(f"{sum(len(r.task_attempts) - 1 for r in retried)} retries: {tokens:,} tokens in all")
            if elapsed_s is not None:
                said.append(f"{elapsed_s / 60:.1f} min")
            self.progress.console.print(f"{bc.name} {lr.load}: done, {', '.join(said)}")

    async def warmup(self, backend: Backend, bc: BenchConfig) -> None:
        n = min(self.cfg.load.warmup, len(self.questions))
        if n:
            self._task = self.progress.add_task(f"{bc.name} warm-up",
                                                total=sum(len(q.turns) for q in self.questions[:n]))
        for q in self.questions[:n]:
            # its own opening words: a server's prefix cache must not hand the measured turns a warm start
            q = replace(q, turns=tuple(f"(Warm-up {i}.) {t}" for i, t in enumerate(q.turns, 1)))
            await self.conversation(backend, bc, q, item=-1, arrival=time.perf_counter(), level=None)
        if n:
            self.progress.remove_task(self._task)

    async def run(self, backend: Backend, bc: BenchConfig, level: Level) -> None:
        load, lv = self.cfg.load, level.load
        qs = level.questions or self.questions
        n = len(qs) if level.questions else self.items_per_pass * self.cfg.repeats
        done = self.rec.done_items(bc, lv.label)
        check = load.steady_state if level.questions is None else None
        steady: SteadyStateCheck | None = None  # made when the level starts
        counter = iter(range(max(n, check.max_requests) if check else n))

        def next_index() -> int | None:
            for i in counter:
                if i >= n and (steady is None or steady.reached):
                    return None
                if steady is not None and check is not None and check.duration_s is not None \
                        and time.perf_counter() - steady.start >= check.duration_s:
                    return None  # held as long as asked: the level ends, steady or not
                if i not in done:
                    return i
            return None

        pick, arrival_s = replay_order(lv, qs)
        total = sum(len(pick(i).turns) for i in range(n) if i not in done)
        self._task = self.progress.add_task(f"{bc.name} {lv.label}", total=total)

        async def job(i: int, arrival: float) -> None:
            q = pick(i)
            tokens = await self.conversation(backend, bc, q, item=i, arrival=arrival, level=level)
            nonlocal total
            if steady is not None:
                steady.completed(tokens, time.perf_counter(), self.meter.read())
                if i >= n:  # past the planned count: the bar grows
                    total += len(q.turns)
                    self.progress.update(self._task, total=total)

        if backend.serial and (lv.concurrency or 2) > 1:
            self.rec.note(f"{bc.name} {lv.label}: the {bc.backend} backend serves one request at a time; "
                          "more in flight means a queue (see queue_s; TTFT counts from arrival)")
        before = await backend.scrape_metrics()
        e0 = self.meter.read()
        started, t_start = now(), time.perf_counter()
        if check is not None:
            steady = SteadyStateCheck(check.window, check.tolerance, check.span, time.perf_counter(), energy_start=e0)
        with ConditionSampler(t0=steady.start) if steady is not None else contextlib.nullcontext() as sampler:
            if lv.replay is not None:
                await replay(job, next_index, arrival_s, lv.replay, max_in_flight=load.max_in_flight)
            elif lv.rate is not None:
                await open_loop(job, next_index, lv.rate, seed=self.cfg.seed, max_in_flight=load.max_in_flight)
            else:
                await closed_loop(job, next_index, lv.concurrency or 1)
        e1 = self.meter.read()
        after = await backend.scrape_metrics()
        self.rec.sync()
        single = self.rec.single_segment(bc, lv.label, done)
        energy = (e1 - e0) if single and e0 is not None and e1 is not None else None
        lr = self.rec.load_result(bc, lv, level.records, energy=energy, started=started)
        lr.telemetry, lr.telemetry_levels = telemetry_delta(before, after) if single else (None, [])
        if steady is not None and check is not None:
            lr.steady_state = steady.result(sampler.samples if sampler is not None else [], check.duration_s)
            if not steady.reached:
                self.rec.note(f"{bc.name} {lv.label}: throughput was not steady when the level ended "
                              f"({len(steady.windows)} window(s) of {steady.window}): its figures are a burst's")
        self.finish(bc, lr, level.records, time.perf_counter() - t_start)
        self.progress.update(self._task, completed=total)

    # ---- one conversation ----

    async def conversation(self, backend: Backend, bc: BenchConfig, q: Question, *, item: int, arrival: float,
                           level: Level | None, block: int | None = None, slot: int | None = None) -> int:
        """Run every turn; turn k+1 sees the model's answer to turn k. Returns output tokens."""
        messages: list[dict[str, str]] = [{"role": "system", "content": q.system}] if q.system else []
        answers: list[str] = []
        tokens = 0
        for turn, text in enumerate(q.turns, 1):
            if q.prompt_tokens is not None:  # a trace's input_length counts the chat template's tokens too
                overhead = backend.template_tokens()
                if overhead is None:
                    self.rec.note(f"{bc.name}: the server's chat template adds tokens on top of the trace's "
                                  "input_length (give the openai backend a tokenizer to size prompts exactly)")
                text = fit_prompt(text, q.prompt_tokens, overhead)
            messages.append({"role": "user", "content": text})
            max_tokens = q.max_tokens or bc.max_tokens
            if level is None and self.cfg.load.warmup_max_tokens:  # a warm-up conversation
                max_tokens = min(max_tokens, self.cfg.load.warmup_max_tokens)
            last = turn == len(q.turns)
            own = {"sampling": answer_sampling(bc.sampling, q)} if last and q.stop else {}  # the answer's stops
            c = await backend.complete(q.sent(messages) if last else list(messages), max_tokens=max_tokens,
                                       min_tokens=min(q.min_tokens, max_tokens) if q.min_tokens else None, **own)
            if not c.ok and c.error_kind in CONNECTION_FAILURES and (why := await backend.gone()):
                # not a measurement of the configuration: unrecorded, so a resume measures it (once)
                where = f"{bc.name} {level.load.label}" if level is not None else f"{bc.name} warm-up"
                raise ServerGone(f"the server went away during {where}: {why}; the level stays incomplete (what it "
                                 f"measured is kept): once the server is back, `specledger bench --resume "
                                 f"{self.rec.run_dir}` measures the rest")
            tokens += c.output_tokens if c.ok else 0
            if level is not None:
                graded = await grade_answer(q, answers + [q.answer(c.text)], self.cfg.workload.grader) \
                    if c.ok and last else None
                rec = self.rec.record(bc, q, c, item=item, turn=turn, arrival=arrival, level=level.load,
                                      grade=graded)
                policy = self.cfg.retry
                if policy is not None and graded is not None and graded.passed is not None and \
                        (self.cfg.quality is None or level.load.label == QUALITY_LEVEL):
                    rec.task_attempts = await retries(backend, bc.sampling, policy, q, messages=list(messages),
                                                 answers=answers, first=c, first_grade=graded, item=item,
                                                 max_tokens=max_tokens, grader=self.cfg.workload.grader)
                rec.repeat = 0 if level.questions else item // self.items_per_pass
                rec.block, rec.slot = block, slot
                self.rec.append(rec)
                level.records.append(rec)
            if self._task is not None:
                self.progress.advance(self._task)
            if not c.ok:
                break
            answers.append(c.text)
            messages.append({"role": "assistant", "content": c.text})
            arrival = time.perf_counter()  # the next turn is sent as soon as this answer is in
        return tokens


def replay_order(level: LoadLevel, qs: list[Question]) -> tuple[Callable[[int], Question], Callable[[int], float]]:
    """Item -> question, and item -> arrival (s after the first) for a replay: the trace in time order,
    repeated after its span (plus its mean gap) when the level issues more items than the trace holds."""
    if level.replay is None:
        return (lambda i: qs[i % len(qs)]), (lambda i: 0.0)
    order = sorted(range(len(qs)), key=lambda k: qs[k].arrival_s or 0.0)
    first = qs[order[0]].arrival_s or 0.0
    span = (qs[order[-1]].arrival_s or 0.0) - first
    period = span + (span / (len(qs) - 1) if len(qs) > 1 else 1.0)

    def arrival(i: int) -> float:
        return (qs[order[i % len(qs)]].arrival_s or 0.0) - first + (i // len(qs)) * period

    return (lambda i: qs[order[i % len(qs)]]), arrival

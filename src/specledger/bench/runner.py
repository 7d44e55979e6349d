"""Run a benchmark: every configuration x load level over the workload, recorded as it goes.

Each finished request is appended to requests.jsonl at once; run.json and summary.csv are
rewritten after every load level, so an interrupted run keeps everything measured and
`resume=True` continues it (conversations with every turn recorded ok are not repeated).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specledger.bench.backends.base import Backend, Completion
from specledger.bench.backends.make import make_backend
from specledger.bench.calibration import assess, take_probe, thread_settings
from specledger.bench.config import QUALITY_LEVEL, BenchConfig, RunConfig, parse_run_config
from specledger.bench.energy import EnergyMeter
from specledger.bench.env import collect_conditions
from specledger.bench.load import SteadyStateCheck, closed_loop, open_loop, replay
from specledger.bench.probes import UNQUANTIZED, measure_agreement, needs_agreement
from specledger.bench.metrics import aggregate, group_by, spread_itl, tpot
from specledger.bench.results import (
    ConfigResult, CurvePoint, EngineTelemetry, GateOutcome, LoadResult, Noise, RequestGrade, RequestLog, RequestRecord, RunResult,
    SteadyState,
    load_run, now, read_requests, write_run, write_summary, REQUESTS_FILE,
)
from specledger.bench.telemetry import telemetry_delta
from specledger.bench.question import Question
from specledger.bench.workload import load_workload
from specledger.engine.registry import model_key
from specledger.errors import BadInput, SpecLedgerError
from specledger.quality.gates import GateResult, comparable, lossless_gate, pass_rate_gate, quantization_gate
from specledger.quality.graders import grade, grading_rules

BackendFactory = Callable[[BenchConfig], Backend]
ReferenceFactory = Callable[[BenchConfig], Any]  # the unquantized model a quantized target is compared with


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


@dataclass
class _Level:
    label: str
    concurrency: int | None
    rate: float | None
    records: list[RequestRecord] = field(default_factory=list)
    replay: float | None = None  # trace replay speed factor
    questions: list[Question] | None = None  # the quality level's own workload (else the run's)


class Runner:
    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        console: Console | None = None,
        show_progress: bool = True,
        backend_factory: BackendFactory | None = None,
        reference_factory: ReferenceFactory | None = None,
    ):
        self.cfg = config
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.console = console or Console(stderr=True)
        self.show_progress = show_progress
        self.backend_factory = backend_factory
        self.reference_factory = reference_factory
        self._loaded: dict[tuple, Any] = {}  # model key -> LoadedModel, shared by configurations and roles
        self._curves: dict[tuple, list[dict]] = {}  # target key -> verification-cost curve
        self._agreements: dict[tuple, dict] = {}  # target key -> agreement with the fp32 model
        self.segment = uuid.uuid4().hex[:8]
        self.meter = EnergyMeter()
        self._t0_perf = time.perf_counter()
        self._t0_wall = time.time()
        self._progress: Progress | None = None
        self._task: Any = None

    # ---- entry points ----

    def run(self) -> RunResult:
        return asyncio.run(self.run_async())

    async def run_async(self) -> RunResult:
        cfg = self.cfg
        workload = cfg.workload.open()
        self.questions = workload.questions
        info = workload.info
        info.grading = grading_rules({q.kind for q in self.questions}, cfg.workload.grader)
        if cfg.load.replay and not info.timed:
            raise BadInput(f"load replay needs a timed workload (trace:FILE with timestamps); {info.spec!r} has "
                           "no arrival times")
        self.console.print(f"workload {info.spec}: {info.format} ({info.chosen}); {info.questions} questions"
                           + (f"; skipped {sum(info.skipped.values())} bad line(s)" if info.skipped else ""))
        q = cfg.quality
        self.quality_questions = load_workload(q.spec, limit=q.limit, seed=q.seed) if q is not None else []
        self._prepare_dir()
        self.run_result.workload = info
        if info.timed and not cfg.load.replay:
            note = "the workload's arrival times are not used at this load (replay them with load.replay / --replay)"
            if note not in self.run_result.notes:
                self.run_result.notes.append(note)
        self.log = RequestLog(self.run_dir)
        self.previous = read_requests(self.run_dir) if self.resume else []
        try:
            with self._progress_bar():
                self._noise_probe("before")
                if self.interleaving:
                    await self._run_interleaved()
                else:
                    for i, bc in enumerate(cfg.configs):
                        if i == len(cfg.configs) // 2 and i > 0:
                            self._noise_probe("during")
                        await self._run_config(bc)
                self._noise_probe("after")
            self.run_result.status = "complete"
        except (KeyboardInterrupt, asyncio.CancelledError):
            self.run_result.status = "interrupted"
            raise
        except SpecLedgerError as exc:
            self.run_result.status = "failed"
            self.run_result.notes.append(f"stopped: {exc}")
            raise
        except Exception as exc:
            self.run_result.status = "failed"
            self.run_result.notes.append(f"crashed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.log.sync()
            self.log.close()
            self._save()
        return self.run_result

    @property
    def interleaving(self) -> bool:
        return self.cfg.interleave and len(self.cfg.configs) > 1

    @property
    def items_per_pass(self) -> int:
        return self.cfg.load.num_requests or len(self.questions)

    def _noise_probe(self, when: str) -> None:
        """Time the calibration probe; the run keeps every probe and the drift between them."""
        if not self.cfg.calibration:
            return
        try:
            p = take_probe(when)
        except ImportError:  # no torch: an HTTP-only install
            return
        noise = self.run_result.noise or Noise(threads=thread_settings())
        noise.probes.append(p)
        self.run_result.noise = assess(noise)

    # ---- setup ----

    def _prepare_dir(self) -> None:
        cfg = self.cfg
        resolved = cfg.model_dump(mode="json")
        if self.resume:
            self.run_result = load_run(self.run_dir)
            self.run_result.status = "running"
            self.run_result.notes.append(f"resumed {now().isoformat(timespec='seconds')} (segment {self.segment})")
            return
        if (self.run_dir / REQUESTS_FILE).exists():
            raise BadInput(f"{self.run_dir} already holds a run; resume it (--resume) or choose another run id")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        conditions = collect_conditions(resolved, seed=cfg.seed, backends={}, energy=self.meter.source,
                                        local_engine=any(c.backend == "inprocess" for c in cfg.configs))
        conditions.interleaved, conditions.order_seed = self.interleaving, cfg.seed if self.interleaving else None
        self.run_result = RunResult(run_id=self.run_dir.name, created=now(), conditions=conditions)
        if not self.meter.available:
            self.run_result.notes.append("energy: unavailable (no RAPL powercap counters or NVML on this machine)")
        self._save()

    def _save(self) -> None:
        self.run_result.updated = now()
        write_run(self.run_dir, self.run_result)
        write_summary(self.run_dir, self.run_result)

    def _progress_bar(self) -> Progress:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, disable=not self.show_progress, transient=False,
        )
        return self._progress

    # ---- one configuration ----

    def _config_result(self, bc: BenchConfig) -> ConfigResult:
        existing = self.run_result.config(bc.name)
        if existing is not None:
            return existing
        cr = ConfigResult(name=bc.name, backend=bc.backend, model=bc.model, strategy=bc.strategy, dtype=bc.dtype,
                          quant=bc.quant, group_size=bc.group_size if bc.quant == "int4" else None,
                          spec=bc.model_dump(mode="json"), quality_source=self.cfg.quality_source(bc))
        self.run_result.configs.append(cr)
        return cr

    def _make_backend(self, bc: BenchConfig) -> Backend:
        if self.backend_factory is not None:
            return self.backend_factory(bc)
        if bc.backend == "inprocess":
            return make_backend(bc, meter=self.meter, models=self._shared_models(bc))
        if bc.openai is not None and bc.openai.server is not None:  # a server started and stopped for it
            from specledger.bench.backends.managed_openai import ManagedOpenAIBackend

            return ManagedOpenAIBackend(bc, log_dir=self.run_dir)
        return make_backend(bc)

    def _model_keys(self, bc: BenchConfig) -> dict[str, tuple]:
        """Role -> the weights it uses (model, dtype, quant, group size, device); "reference": the fp32
        model the quantization gate compares the target with."""
        def key(model: str, dtype: str, quant: str, group_size: int) -> tuple:
            return (model_key(model), dtype, quant, group_size if quant == "int4" else None, bc.device)

        keys = {"target": key(bc.model, bc.dtype, bc.quant, bc.group_size)}
        for role in ("draft", "intermediate"):
            spec = getattr(bc, role)
            if spec is not None:
                keys[role] = key(spec.model, spec.dtype, spec.quant, spec.group_size)
        if self.cfg.gates.quantization and needs_agreement(bc):
            keys["reference"] = key(bc.model, *UNQUANTIZED, bc.group_size)
        return keys

    def _shared_models(self, bc: BenchConfig) -> dict[str, Any]:
        """Configurations share loaded weights (read-only; each run has its own caches), in any role; a
        loaded model is kept only while a later configuration still needs it."""
        later = {k for c in self.cfg.configs[self.cfg.configs.index(bc):] if c.backend == "inprocess"
                 for k in self._model_keys(c).values()}
        for k in [k for k in self._loaded if k not in later]:
            del self._loaded[k]
        return {role: self._loaded[k] for role, k in self._model_keys(bc).items()
                if role != "reference" and k in self._loaded}

    def _keep_models(self, bc: BenchConfig, backend: Backend) -> None:
        models = getattr(backend, "models", None)
        if bc.backend == "inprocess" and self.backend_factory is None and models:
            for role, k in self._model_keys(bc).items():
                if role in models:
                    self._loaded[k] = models[role]

    def _reference(self, bc: BenchConfig) -> Any:
        if self.reference_factory is not None:
            return self.reference_factory(bc)
        k = self._model_keys(bc)["reference"]
        if k not in self._loaded:
            from specledger.engine.loader import load_model

            self._loaded[k] = load_model(bc.model, dtype=UNQUANTIZED[0], quant=UNQUANTIZED[1], device=bc.device)
        return self._loaded[k]

    async def _probe(self, bc: BenchConfig, backend: Backend, cr: ConfigResult) -> None:
        """Once per target: its verification-cost curve and, unless it is the fp32 model, its agreement."""
        target_key = self._model_keys(bc)["target"] if bc.backend == "inprocess" else (bc.name,)
        lm = (getattr(backend, "models", None) or {}).get("target")
        todo = []
        if self.cfg.verify_curve and target_key not in self._curves:
            todo.append("verification-cost curve")
        if (self.cfg.gates.quantization and needs_agreement(bc) and lm is not None
                and target_key not in self._agreements):
            todo.append("agreement with fp32")
        task = None
        if todo and self._progress is not None:
            task = self._progress.add_task(f"{bc.name}: {' + '.join(todo)}", total=None)
        try:
            if "verification-cost curve" in todo:
                self._curves[target_key] = await backend.verify_curve() or []
            if "agreement with fp32" in todo:
                ref = await asyncio.to_thread(self._reference, bc)
                self._agreements[target_key] = await asyncio.to_thread(measure_agreement, ref, lm)
        finally:
            if task is not None:
                self._progress.remove_task(task)
        cr.verify_curve = [CurvePoint(**p) for p in self._curves.get(target_key, [])] or cr.verify_curve
        cr.agreement = self._agreements.get(target_key, cr.agreement)

    def _skip(self, bc: BenchConfig, exc: SpecLedgerError) -> None:
        """An optional configuration that cannot start: say so, drop its (empty) results, run the rest."""
        note = f"skipped {bc.name}: {str(exc).removeprefix(f'configuration {bc.name!r}: ')}"
        self.run_result.notes.append(note)
        self.run_result.configs = [c for c in self.run_result.configs if c.name != bc.name]
        self.console.print(f"[yellow]{note}[/yellow]")
        self._save()

    async def _run_config(self, bc: BenchConfig) -> None:
        cr = self._config_result(bc)
        done_levels = {lr.load for lr in cr.loads if lr.complete}
        levels = [lv for lv in self.cfg.load.levels() if lv[0] not in done_levels]
        quality = self._needs_quality(bc)
        if not levels and not quality:
            return
        backend = self._make_backend(bc)
        try:
            await backend.start()
        except SpecLedgerError as exc:
            if not bc.optional or cr.loads:
                raise
            await backend.close()
            return self._skip(bc, exc)
        self._keep_models(bc, backend)
        try:
            self.run_result.conditions.backends[bc.name] = backend.describe()
            await self._probe(bc, backend, cr)
            await self._warmup(backend, bc)
            for label, conc, rate in levels:
                speed = self.cfg.load.replay_speed(label)
                await self._run_level(backend, bc, cr, _Level(label, conc, rate, replay=speed))
            if quality:
                await self._run_level(backend, bc, cr, _Level(QUALITY_LEVEL, 1, None, questions=self.quality_questions))
        finally:
            await backend.close()

    def _needs_quality(self, bc: BenchConfig) -> bool:
        cr = self.run_result.config(bc.name)
        return (self.cfg.quality is not None and self.cfg.quality_source(bc) == bc.name
                and not (cr is not None and any(lr.load == QUALITY_LEVEL and lr.complete for lr in cr.loads)))

    async def _run_interleaved(self) -> None:
        """Every configuration up at once (shared weights), a warm-up each, then each load level: one at a time
        (concurrency 1) request by request in seeded random block order; other levels configuration by
        configuration in seeded random order."""
        cfg = self.cfg
        rng = random.Random(cfg.seed)
        backends: dict[str, Backend] = {}
        all_levels = [lv[0] for lv in cfg.load.levels()]
        try:
            for bc in cfg.configs:
                cr = self._config_result(bc)
                if all(lv in {lr.load for lr in cr.loads if lr.complete} for lv in all_levels) \
                        and not self._needs_quality(bc):
                    continue
                backend = self._make_backend(bc)
                try:
                    await backend.start()
                except SpecLedgerError as exc:
                    await backend.close()
                    if not bc.optional or cr.loads:
                        raise
                    self._skip(bc, exc)
                    continue
                backends[bc.name] = backend
                self._keep_models(bc, backend)
                self.run_result.conditions.backends[bc.name] = backend.describe()
                await self._probe(bc, backend, cr)
            live = [bc for bc in cfg.configs if bc.name in backends]
            for bc in rng.sample(live, len(live)):
                await self._warmup(backends[bc.name], bc)
            for label, conc, rate in cfg.load.levels():
                todo = [bc for bc in live
                        if label not in {lr.load for lr in self._config_result(bc).loads if lr.complete}]
                if not todo:
                    continue
                speed = cfg.load.replay_speed(label)
                if conc == 1 and not cfg.load.steady_state and speed is None:
                    await self._interleaved_level(backends, todo, label, rng)
                else:
                    for bc in rng.sample(todo, len(todo)):
                        await self._run_level(backends[bc.name], bc, self._config_result(bc),
                                              _Level(label, conc, rate, replay=speed))
            todo = [bc for bc in live if self._needs_quality(bc)]
            if todo:
                await self._interleaved_level(backends, todo, QUALITY_LEVEL, rng, questions=self.quality_questions)
        finally:
            for b in backends.values():
                await b.close()

    async def _interleaved_level(self, backends: dict[str, Backend], todo: list[BenchConfig], label: str,
                                 rng: random.Random, questions: list[Question] | None = None) -> None:
        qs = questions or self.questions
        n = len(qs) if questions else self.items_per_pass * self.cfg.repeats
        levels = {bc.name: _Level(label, 1, None, questions=questions) for bc in todo}
        done = {bc.name: self._done_items(bc, label) for bc in todo}
        total = sum(len(qs[i % len(qs)].turns)
                    for bc in todo for i in range(n) if i not in done[bc.name])
        if self._progress is not None:
            self._task = self._progress.add_task(f"{len(todo)} configurations interleaved {label}", total=total)
        urls = [bc.openai.base_url for bc in todo if bc.openai is not None]
        energy: dict[str, float | None] = {bc.name: 0.0 for bc in todo}
        before = {bc.name: await backends[bc.name].scrape_metrics() for bc in todo}
        started = now()
        for i in range(n):
            order = rng.sample(todo, len(todo))
            for slot, bc in enumerate(order):
                if i in done[bc.name]:
                    continue
                q = qs[i % len(qs)]
                e0 = self.meter.read()
                await self._conversation(backends[bc.name], bc, q, item=i, arrival=time.perf_counter(),
                                         level=levels[bc.name], block=i, slot=slot)
                e1 = self.meter.read()
                energy[bc.name] = None if e0 is None or e1 is None or energy[bc.name] is None \
                    else energy[bc.name] + (e1 - e0)
            if i == n // 2 and n > 1:
                self._noise_probe("during")
        after = {bc.name: await backends[bc.name].scrape_metrics() for bc in todo}
        self.log.sync()
        for bc in todo:
            single_segment = not done[bc.name] and not any(
                r.config == bc.name and r.load == label for r in self.previous)
            lr = self._load_result(bc, levels[bc.name], energy=energy[bc.name] if single_segment else None,
                                   started=started, interleaved=True)
            # a server shared by several configurations mixes their counters: no per-configuration delta
            if single_segment and (bc.openai is None or urls.count(bc.openai.base_url) == 1):
                lr.telemetry, lr.telemetry_levels = telemetry_delta(before[bc.name], after[bc.name])
            lr.complete = True
            cr = self._config_result(bc)
            cr.loads = [x for x in cr.loads if x.load != label] + [lr]
            order_ = [lv[0] for lv in self.cfg.load.levels()]
            cr.loads.sort(key=lambda x: order_.index(x.load) if x.load in order_ else len(order_))
        self._apply_gates()
        self._save()
        if self._progress is not None:
            self._progress.update(self._task, completed=total)

    async def _warmup(self, backend: Backend, bc: BenchConfig) -> None:
        n = min(self.cfg.load.warmup, len(self.questions))
        if n and self._progress is not None:
            task = self._progress.add_task(f"{bc.name} warm-up", total=sum(len(q.turns) for q in self.questions[:n]))
            self._task = task
        for q in self.questions[:n]:
            await self._conversation(backend, bc, q, item=-1, arrival=time.perf_counter(), level=None)
        if n and self._progress is not None:
            self._progress.remove_task(self._task)

    def _done_items(self, bc: BenchConfig, label: str) -> set[int]:
        turns: dict[int, set[int]] = defaultdict(set)
        needed: dict[int, int] = {}
        for r in self.previous:
            if r.config == bc.name and r.load == label and r.status == "ok":
                turns[r.item].add(r.turn)
                needed[r.item] = r.turns
        return {i for i, t in turns.items() if len(t) >= needed[i]}

    async def _run_level(self, backend: Backend, bc: BenchConfig, cr: ConfigResult, level: _Level) -> None:
        load = self.cfg.load
        qs = level.questions or self.questions
        n = len(qs) if level.questions else self.items_per_pass * self.cfg.repeats
        done = self._done_items(bc, level.label)
        check = load.steady_state if level.questions is None else None
        steady = SteadyStateCheck(check.window, check.tolerance) if check else None
        limit = max(n, check.max_requests) if check else n
        counter = iter(range(limit))

        def next_index() -> int | None:
            for i in counter:
                if i >= n and (steady is None or steady.reached):
                    return None
                if i not in done:
                    return i
            return None

        pick, arrival_s = self._order(level, qs)
        total = sum(len(pick(i).turns) for i in range(n) if i not in done)
        if self._progress is not None:
            self._task = self._progress.add_task(f"{bc.name} {level.label}", total=total)

        async def job(i: int, arrival: float) -> None:
            q = pick(i)
            tokens = await self._conversation(backend, bc, q, item=i, arrival=arrival, level=level)
            nonlocal total
            if steady is not None:
                steady.completed(tokens, time.perf_counter())
                if self._progress is not None and i >= n:  # past the planned count: the bar grows
                    total += len(q.turns)
                    self._progress.update(self._task, total=total)

        if backend.serial and (level.concurrency or 2) > 1:
            note = (f"{bc.name} {level.label}: the {bc.backend} backend serves one request at a time; "
                    "more in flight means a queue (see queue_s; TTFT counts from arrival)")
            if note not in self.run_result.notes:
                self.run_result.notes.append(note)
        before = await backend.scrape_metrics()
        e0 = self.meter.read()
        started = now()
        if level.replay is not None:
            await replay(job, next_index, arrival_s, level.replay, max_in_flight=load.max_in_flight)
        elif level.rate is not None:
            await open_loop(job, next_index, level.rate, seed=self.cfg.seed, max_in_flight=load.max_in_flight)
        else:
            await closed_loop(job, next_index, level.concurrency or 1)
        e1 = self.meter.read()
        after = await backend.scrape_metrics()
        self.log.sync()

        single_segment = not done and not any(
            r.config == bc.name and r.load == level.label for r in self.previous)
        energy = (e1 - e0) if single_segment and e0 is not None and e1 is not None else None
        telemetry, tele_levels = telemetry_delta(before, after) if single_segment else (None, [])
        lr = self._load_result(bc, level, energy=energy, started=started)
        lr.telemetry, lr.telemetry_levels = telemetry, tele_levels
        if steady is not None:
            lr.steady_state = SteadyState(window=steady.window, tolerance=steady.tolerance, reached=steady.reached,
                                          windows_tok_s=steady.windows)
        lr.complete = True
        cr.loads = [x for x in cr.loads if x.load != level.label] + [lr]
        order = [lv[0] for lv in self.cfg.load.levels()]
        cr.loads.sort(key=lambda x: order.index(x.load) if x.load in order else len(order))
        self._apply_gates()
        self._save()
        if self._progress is not None:
            self._progress.update(self._task, completed=total)

    def _order(self, level: _Level, qs: list[Question]) -> tuple[Callable[[int], Question], Callable[[int], float]]:
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

    def _load_result(self, bc: BenchConfig, level: _Level, *, energy: float | None, started: Any,
                     interleaved: bool = False) -> LoadResult:
        """Aggregates of one configuration at one level. Interleaved: its device time is the time its own
        requests were in service (the other configurations' requests ran in between)."""
        merged: dict[str, RequestRecord] = {}
        for r in self.previous:
            if r.config == bc.name and r.load == level.label:
                merged[r.request_id] = r
        for r in level.records:
            merged[r.request_id] = r
        records = list(merged.values())
        by_segment = group_by(records, "segment")
        wall = None if interleaved else sum(max(r.end_t for r in rs) - min(r.arrival_t for r in rs)
                                            for rs in by_segment.values())
        b, seed, slo = self.cfg.bootstrap, self.cfg.seed, self.cfg.slo
        lr = LoadResult(
            load=level.label, concurrency=level.concurrency, rate=level.rate, replay=level.replay, started=started,
            aggregate=aggregate(records, wall_s=wall, energy_j=energy, slo=slo, resamples=b, seed=seed),
            segments=len(by_segment),
        )
        small = b // 5
        lr.by_category = {k: aggregate(v, slo=slo, resamples=small, seed=seed)
                          for k, v in group_by(records, "category").items()}
        lr.by_kind = {k: aggregate(v, slo=slo, resamples=small, seed=seed) for k, v in group_by(records, "kind").items()}
        return lr

    # ---- one conversation ----

    async def _conversation(self, backend: Backend, bc: BenchConfig, q: Question, *, item: int, arrival: float,
                            level: _Level | None, block: int | None = None, slot: int | None = None) -> int:
        """Run every turn; turn k+1 sees the model's answer to turn k. Returns output tokens."""
        messages: list[dict[str, str]] = [{"role": "system", "content": q.system}] if q.system else []
        answers: list[str] = []
        tokens = 0
        for turn, text in enumerate(q.turns, 1):
            messages.append({"role": "user", "content": text})
            limit = q.max_new_tokens or bc.max_new_tokens
            if level is None and self.cfg.load.warmup_max_new_tokens:  # a warm-up conversation
                limit = min(limit, self.cfg.load.warmup_max_new_tokens)
            c = await backend.complete(list(messages), max_new_tokens=limit,
                                       min_new_tokens=min(q.min_new_tokens, limit) if q.min_new_tokens else None)
            tokens += c.output_tokens if c.ok else 0
            if level is not None:
                rec = self._record(bc, q, c, item=item, turn=turn, arrival=arrival, level=level)
                rec.repeat = 0 if level.questions else item // self.items_per_pass
                rec.block, rec.slot = block, slot
                if c.ok and turn == len(q.turns):
                    g = grade(q, answers + [c.text], self.cfg.workload.grader)
                    rec.grade = RequestGrade(passed=g.passed, score=g.score, grader=g.grader, detail=g.detail)
                self.log.append(rec)
                level.records.append(rec)
            if self._progress is not None and self._task is not None:
                self._progress.advance(self._task)
            if not c.ok:
                break
            answers.append(c.text)
            messages.append({"role": "assistant", "content": c.text})
            arrival = time.perf_counter()  # the next turn is sent as soon as this answer is in
        return tokens

    def _wall(self, t: float) -> float:
        return self._t0_wall + (t - self._t0_perf)

    def _record(self, bc: BenchConfig, q: Question, c: Completion, *, item: int, turn: int, arrival: float,
                level: _Level) -> RequestRecord:
        ttft = (c.first_token - arrival) if c.first_token is not None else None
        e2e = c.end - arrival
        disagree = (c.usage_output_tokens is not None and c.tokenizer_output_tokens is not None
                    and c.usage_output_tokens != c.tokenizer_output_tokens)
        return RequestRecord(
            run_id=self.run_result.run_id, config=bc.name,
            request_id=f"{bc.name}|{level.label}|{item}|t{turn}", item=item,
            question_id=q.question_id, category=q.category, kind=q.kind, turn=turn, turns=len(q.turns),
            load=level.label, concurrency=level.concurrency, rate=level.rate, segment=self.segment,
            status="ok" if c.ok else "failed", error=c.error, error_kind=None if c.ok else (c.error_kind or "other"),
            attempts=c.attempts, transport_retries=c.transport_retries, transport_errors=c.transport_errors,
            finish_reason=c.finish_reason,
            prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens if c.ok else 0,
            usage_output_tokens=c.usage_output_tokens, tokenizer_output_tokens=c.tokenizer_output_tokens,
            usage_disagrees=disagree,
            arrival_t=self._wall(arrival), start_t=self._wall(c.start),
            first_token_t=self._wall(c.first_token) if c.first_token is not None else None,
            end_t=self._wall(c.end), queue_s=max(0.0, c.start - arrival),
            ttft_s=ttft if c.ok else None, e2e_s=e2e if c.ok else None,
            tpot_s=tpot(e2e, ttft, c.output_tokens) if c.ok else None,
            itl_s=spread_itl(c.chunks) if c.ok else [],
            output_text=c.text, output_token_ids=c.token_ids,
            **{name: getattr(c, name) for name in EngineTelemetry.model_fields},
        )

    # ---- quality gates ----

    def _apply_gates(self) -> None:
        records = read_requests(self.run_dir)
        apply_gates(self.run_result, records, self.cfg)


def _gate(g: GateResult) -> GateOutcome:
    return GateOutcome(name=g.name, passed=g.passed, reason=g.reason, figures=g.figures)


def _outputs(records: list[RequestRecord]) -> tuple[dict[str, list[int]], bool]:
    """Greedy outputs keyed by load|item|turn: token ids where known, else the text's characters."""
    ok = [r for r in records if r.status == "ok"]
    ids = all(r.output_token_ids is not None for r in ok)
    out = {f"{r.load}|{r.item}|t{r.turn}": (r.output_token_ids if ids else [ord(ch) for ch in r.output_text])
           for r in ok}
    return out, ids


def apply_gates(run: RunResult, records: list[RequestRecord], cfg: RunConfig) -> None:
    """Lossless (greedy, vs the `ar` configuration of the same target and precision), quantization (agreement
    with the fp32 model, when measured) and pass rate."""
    by_config = group_by(records, "config")
    specs = {c.name: c for c in cfg.configs}
    for cr in run.configs:
        bc = specs.get(cr.name)
        recs = by_config.get(cr.name, [])
        gates: list[GateOutcome] = []
        if bc is not None and bc.strategy != "ar":
            ref = next((o for o in cfg.configs if o.strategy == "ar" and o.name != bc.name
                        and o.target_key() == bc.target_key() and o.greedy), None)
            if not bc.greedy:
                gates.append(GateOutcome(name="lossless", passed=None,
                                         reason="not checked: sampling (temperature > 0); checked on greedy runs"))
            elif ref is None:
                gates.append(GateOutcome(name="lossless", passed=None, reason="not checked: no greedy 'ar' "
                                         "configuration of the same target and precision in this run"))
            elif ref.name in by_config and recs:
                ref_out, ref_ids = _outputs([r for r in by_config[ref.name] if r.load != QUALITY_LEVEL])
                cand_out, cand_ids = _outputs([r for r in recs if r.load != QUALITY_LEVEL])
                sixteen = bc.dtype in ("bf16", "fp16")
                min_share = cfg.gates.lossless_min_share_16bit if sixteen else cfg.gates.lossless_min_share
                g = _gate(lossless_gate(ref_out, cand_out, min_share=min_share))
                if sixteen and g.figures.get("first_divergence") and g.passed:
                    g.reason += f" ({bc.dtype} rounding: at least {min_share:.0%} identical required)"
                g.figures["reference"] = ref.name
                g.figures["compared_on"] = "token ids" if ref_ids and cand_ids else "text characters"
                gates.append(g)
        if cr.agreement is not None and cfg.gates.quantization:
            gates.append(_quantization(cr.agreement, cfg))
        source = cfg.quality_source(bc) if bc is not None else None
        if source is not None:  # the graded quality level (of this configuration or its lossless reference)
            graded = _pass_rate_sample([r for r in by_config.get(source, []) if r.load == QUALITY_LEVEL], bc)
            graded = graded or _pass_rate_sample(recs, bc)
        else:
            graded = _pass_rate_sample(recs, bc)
        # a failed request is a failed attempt: not accepted, in the denominator (when anything was graded)
        outcomes = [r.grade.passed if r.grade else None for r in graded if r.status == "ok"]
        if any(o is not None for o in outcomes):
            outcomes += [False for r in graded if r.status != "ok"]
        pr = pass_rate_gate(outcomes, min_rate=cfg.gates.min_pass_rate)
        gates.append(_gate(pr))
        if any(r.status != "ok" for r in recs):
            gates.append(failure_gate(recs, cfg.gates.max_failure_rate))
        cr.pass_rate = pr.figures.get("rate")
        cr.pass_ci = (pr.figures["ci_low"], pr.figures["ci_high"]) if pr.figures.get("graded") else None
        cr.gates = gates
        checked = [GateResult(g.name, bool(g.passed), g.reason, g.figures) for g in gates if g.passed is not None]
        cr.comparable, cr.comparable_reason = comparable(checked)


def failure_gate(records: list[RequestRecord], max_rate: float) -> GateOutcome:
    """Requests that failed (after retries), by kind; above max_rate the configuration is not comparable:
    its figures would rest on the requests that happened to succeed."""
    failed = [r for r in records if r.status != "ok"]
    rate = len(failed) / len(records) if records else 0.0
    kinds = Counter(r.error_kind or "other" for r in failed)
    detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    summary = f"{len(failed)}/{len(records)} requests failed ({rate:.1%}: {detail})"
    passed = rate <= max_rate
    reason = f"{summary}, {'within' if passed else 'above'} the maximum {max_rate:.0%}"
    return GateOutcome(name="failures", passed=passed, reason=reason,
                       figures={"failed": len(failed), "requests": len(records), "rate": rate, "kinds": dict(kinds),
                                "max_rate": max_rate})


def _quantization(agreement: dict[str, Any], cfg: RunConfig) -> GateOutcome:
    g = _gate(quantization_gate(agreement["top1_agreement"], agreement["mean_kl"],
                                min_agreement=cfg.gates.min_agreement, max_kl=cfg.gates.max_kl))
    g.figures |= {k: agreement.get(k) for k in ("reference", "tokens", "ppl_reference", "ppl_candidate")}
    g.reason += f" vs {agreement.get('reference')}, teacher-forced over {agreement.get('tokens')} tokens"
    return g


def _pass_rate_sample(records: list[RequestRecord], bc: BenchConfig | None) -> list[RequestRecord]:
    """Graded conversations, and every failed request (each a failed attempt; a conversation stops at its
    first failure). Greedy outputs repeat across load levels, so count each graded question once."""
    last = [r for r in records if r.turn == r.turns and r.status == "ok"]
    failed = [r for r in records if r.status != "ok"]
    if bc is None or not bc.greedy:
        return last + failed
    seen: dict[str, RequestRecord] = {}
    for r in sorted(last, key=lambda r: (r.load, r.item)):
        seen.setdefault(r.question_id, r)
    return list(seen.values()) + failed


def run_benchmark(config: RunConfig, *, run_dir: str | Path | None = None, console: Console | None = None,
                  show_progress: bool = True) -> tuple[RunResult, Path]:
    """Start a new run; returns its results and directory."""
    run_id = config.run_id or new_run_id()
    path = Path(run_dir) if run_dir is not None else Path(config.output_dir) / run_id
    result = Runner(config, path, console=console, show_progress=show_progress).run()
    return result, path


def resume_benchmark(run_dir: str | Path, *, console: Console | None = None,
                     show_progress: bool = True) -> tuple[RunResult, Path]:
    """Continue an interrupted run with the configuration it recorded."""
    run = load_run(run_dir)
    config = parse_run_config(run.conditions.config, source=f"{run_dir}/run.json")
    result = Runner(config, run_dir, resume=True, console=console, show_progress=show_progress).run()
    return result, Path(run_dir)

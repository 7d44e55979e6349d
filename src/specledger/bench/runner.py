"""Run a benchmark: every configuration x load level over the workload, recorded as it goes.

The runner starts each configuration's backend (one after another, or all at once when interleaved) and
hands it to the load levels (bench/levels.py: levels and conversations). Where results go and how an
interrupted run resumes: bench/recorder.py; which loaded weights configurations share: bench/shared_models.py
(the model pool); which gates each configuration gets: quality/policy.py. `resume=True` continues an
interrupted run (conversations with every turn recorded ok are not repeated).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specledger.bench.backends.base import Backend
from specledger.bench.backends.make import make_backend
from specledger.bench.calibration import assess, take_probe, thread_settings
from specledger.records.config import QUALITY_LEVEL, BenchConfig, LoadLevel, RunConfig, parse_run_config
from specledger.bench.energy import EnergyMeter
from specledger.bench.levels import Level, Levels
from specledger.bench.memory_plan import drift_text, in_flight, plan as plan_memory
from specledger.bench.recorder import RunRecorder
from specledger.records.results import ConfigResult, Noise, RunResult, load_run, thread_choice_text
from specledger.bench.shared_models import ReferenceFactory, SharedModels
from specledger.bench.workload import load_workload, open_settings
from specledger.engine.pool import POOL, ModelPool
from specledger.errors import BadInput, SpecLedgerError
from specledger.quality.graders import grading_rules

BackendFactory = Callable[[BenchConfig], Backend]


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
        pool: ModelPool = POOL,
    ):
        self.cfg = cfg = config
        self.console = console or Console(stderr=True)
        self.backend_factory = backend_factory
        self.models = SharedModels(config, pool, reference_factory)
        # the estimate sees this process tree only: a server it did not start would be left out, so none then
        local = all(bc.backend == "inprocess" or (bc.openai is not None and bc.openai.server is not None)
                    for bc in cfg.configs)
        watts = cfg.cpu_watts or (float(os.environ["SPECLEDGER_CPU_WATTS"]) if os.environ.get("SPECLEDGER_CPU_WATTS")
                                  else None)
        self.meter = EnergyMeter(estimate=local, cpu_watts=watts)
        workload = open_settings(cfg.workload)
        self.questions = workload.questions
        info = workload.info
        info.grading = grading_rules({q.kind for q in self.questions}, cfg.workload.grader)
        if cfg.load.replay and not info.timed:
            raise BadInput(f"load replay needs a timed workload (trace:FILE with timestamps); {info.spec!r} has "
                           "no arrival times")
        self.console.print(f"workload {info.spec}: {info.format} ({info.chosen}); {info.questions} questions"
                           + (f"; skipped {sum(info.skipped.values())} bad line(s)" if info.skipped else ""))
        q = cfg.quality
        self.quality_questions = load_workload(q.spec, limit=q.limit, sample=q.sample, seed=q.seed) \
            if q is not None else []
        self.interleaving = cfg.interleave and len(cfg.configs) > 1
        # before anything is loaded: the predicted peak, and the groups of arms that fit (or one line refusing)
        self.memory = plan_memory(cfg.configs, self.models.keys, self.questions + self.quality_questions,
                                  interleaved=self.interleaving, reference_of=self.models.reference_key,
                                  in_flight=in_flight(cfg))
        if self.memory.added:  # the anchor's copies: arms of the run, recorded (and resumed) as any other
            self.cfg = cfg = cfg.model_copy(update={"configs": [*cfg.configs, *self.memory.added]})
            self.models.cfg, self.models.scope = cfg, cfg.configs
        self.console.print(self.memory.text())
        self.rec = RunRecorder(cfg, Path(run_dir), resume=resume, info=info, energy_source=self.meter.source,
                               energy_available=self.meter.available, interleaved=self.interleaving,
                               console=self.console)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, disable=not show_progress, transient=False,
        )
        self.levels = Levels(cfg, self.rec, self.questions, meter=self.meter, progress=self.progress,
                             noise_probe=self._noise_probe)

    # ---- entry points ----

    def run(self) -> RunResult:
        return asyncio.run(self.run_async())

    async def run_async(self) -> RunResult:
        cfg, result = self.cfg, self.rec.result
        self.rec.open()
        try:
            with self.progress:
                self._read_references()
                self._choose_threads()
                self._noise_probe("before")
                rng = random.Random(cfg.seed)
                groups = self.memory.groups
                if len(groups) > 1 and self.interleaving or self.memory.lean:
                    self.rec.note(self.memory.text())
                for i, group in enumerate(groups):
                    if i == len(groups) // 2 and i > 0:  # (interleaved: halfway through each level instead)
                        self._noise_probe("during")
                    if len(groups) > 1 and self.interleaving or self.memory.lean:
                        self.models.scope = group  # only this group's models are held
                    await self._run_configs(group, rng)
                self._noise_probe("after")
            if (drift := drift_text(result.configs)) is not None:
                self.rec.note(drift)
            result.status = "complete"
        except (KeyboardInterrupt, asyncio.CancelledError):
            result.status = "interrupted"
            raise
        except Exception as exc:
            result.status = "failed"
            result.notes.append(f"stopped: {exc}" if isinstance(exc, SpecLedgerError) else
                                f"crashed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.rec.close()
            self.models.release()
        return result

    def _read_references(self) -> None:
        """The quantization gate's fp32 references, read before the arms (bench/shared_models.read_references)."""
        if self.backend_factory is not None and self.models.reference_factory is None:
            return
        if not any(self.models.reference_key(bc) is not None for bc in self.cfg.configs):
            return
        first = {k for bc in self.memory.groups[0] if bc.backend == "inprocess" for k in self.models.keys(bc).values()}
        from specledger.engine import threads

        task = self.progress.add_task("quantization gate: the fp32 reference, read once", total=None)
        try:
            threads.run(self.models.read_references, first)
        except ImportError:  # no torch: an HTTP-only install
            return
        finally:
            self.progress.remove_task(task)

    def _choose_threads(self) -> None:
        """torch's thread count for the run, before any backend starts its workers (bench/threads.py): as
        given, else from a probe of the in-process targets (interleaved: every distinct one, all loaded for
        the run anyway; one after another: the first configuration's). Backends given by the caller (tests)
        are not probed."""
        from specledger.bench.threads import choose_threads
        from specledger.engine import threads

        inproc = [bc for bc in self.cfg.configs if bc.backend == "inprocess"]
        if not inproc or (self.backend_factory is not None and self.cfg.threads is None):
            return
        task = self.progress.add_task("torch threads: loading the targets, probing", total=None)
        try:
            models: dict[str, Any] = {}
            if self.cfg.threads is None:
                first = self.memory.groups[0]  # interleaved: every target of the first group, held for it anyway
                for bc in [c for c in first if c.backend == "inprocess"] if self.interleaving else inproc[:1]:
                    try:
                        lm = threads.run(self.models.load_target, bc)  # torch work: on its thread
                    except SpecLedgerError:
                        if bc.optional:  # skipped with its note when it fails to start
                            continue
                        raise
                    models.setdefault(getattr(lm, "label", bc.name), lm)
            choice = choose_threads(models, given=self.cfg.threads)
        except ImportError:  # no torch: an HTTP-only install
            return
        finally:
            self.progress.remove_task(task)
        noise = self.rec.result.noise or Noise()
        noise.thread_choice = choice
        noise.threads = thread_settings()
        self.rec.result.noise = noise
        self.console.print(f"torch threads: {thread_choice_text(choice)}")

    def _noise_probe(self, when: str) -> None:
        """Time the calibration probe; the run keeps every probe and the drift between them."""
        if not self.cfg.calibration:
            return
        from specledger.engine import threads

        # on the torch thread, as every torch op of the process (engine/threads.py): the probe's product on the main
        # thread, in a run whose thread count was given (no thread probe before it), left the engine's decode 1.7x
        # slower for the rest of the run (1.5B W4A16: TPOT 40 against 24 ms; BENCHMARKS.md, session 22)
        try:
            p = threads.run(take_probe, when)
        except ImportError:  # no torch: an HTTP-only install
            return
        noise = self.rec.result.noise or Noise(threads=thread_settings())
        noise.probes.append(p)
        self.rec.result.noise = assess(noise)

    # ---- configurations ----

    def _make_backend(self, bc: BenchConfig) -> Backend:
        if self.backend_factory is not None:
            return self.backend_factory(bc)
        if bc.backend == "inprocess":
            return make_backend(bc, meter=self.meter, models=self.models.for_config(bc), in_flight=in_flight(self.cfg))
        return make_backend(bc, log_dir=self.rec.run_dir)  # a server the configuration names is started there

    async def _start(self, bc: BenchConfig, cr: ConfigResult) -> Backend | None:
        """A started backend, shared models kept and the target probed; None: an optional one skipped."""
        backend = self._make_backend(bc)
        try:
            await backend.start()
        except SpecLedgerError as exc:
            await backend.close()
            if not bc.optional or cr.loads:
                raise
            self.rec.skip(bc, exc, self.console)
            return None
        models = getattr(backend, "models", None)
        if bc.backend == "inprocess" and self.backend_factory is None and models:
            self.models.keep(bc, models)
        try:
            self.rec.result.conditions.backends[bc.name] = backend.describe()
            await self.models.probe(bc, backend, cr, self.progress)
        except BaseException:
            await backend.close()
            raise
        return backend

    def _needs_quality(self, bc: BenchConfig) -> bool:
        return (self.cfg.quality is not None and self.cfg.quality_source(bc) == bc.name
                and QUALITY_LEVEL not in self.rec.complete(bc))

    def _quality_level(self) -> Level:
        """The graded items, `quality.concurrency` in flight (batched configurations: one pass for all)."""
        q = self.cfg.quality
        return Level(LoadLevel(QUALITY_LEVEL, concurrency=q.concurrency if q is not None else 1),
                     questions=self.quality_questions)

    async def _run_configs(self, configs: list[BenchConfig], rng: random.Random) -> None:
        """These configurations up at once (shared weights; one at a time when not interleaving), a warm-up each,
        then each load level they have not completed: interleaving, one at a time (concurrency 1) request by request
        in seeded random block order; other levels configuration by configuration in seeded random order."""
        cfg = self.cfg
        backends: dict[str, Backend] = {}
        all_levels = {lv.label for lv in cfg.load.levels()}
        try:
            for bc in configs:
                cr = self.rec.config_result(bc)
                if all_levels <= self.rec.complete(bc) and not self._needs_quality(bc):
                    continue
                backend = await self._start(bc, cr)
                if backend is not None:
                    backends[bc.name] = backend
            live = [bc for bc in configs if bc.name in backends]
            for bc in rng.sample(live, len(live)):
                await self.levels.warmup(backends[bc.name], bc)
            for lv in cfg.load.levels():
                todo = [bc for bc in live if lv.label not in self.rec.complete(bc)]
                if not todo:
                    continue
                if self.interleaving and lv.concurrency == 1 and not cfg.load.steady_state and lv.replay is None:
                    await self.levels.interleaved(backends, todo, Level(lv), rng)
                else:
                    for bc in rng.sample(todo, len(todo)):
                        await self.levels.run(backends[bc.name], bc, Level(lv))
            # the quality level is not timed for the ledger: each source's items in flight together, the
            # sources in seeded random order
            todo = [bc for bc in live if self._needs_quality(bc)]
            for bc in rng.sample(todo, len(todo)):
                await self.levels.run(backends[bc.name], bc, self._quality_level())
        finally:
            for b in backends.values():
                await b.close()


def run_benchmark(config: RunConfig, *, run_dir: str | Path | None = None, console: Console | None = None,
                  show_progress: bool = True) -> tuple[RunResult, Path]:
    """Start a new run; returns its results and directory."""
    run_id = config.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    path = Path(run_dir) if run_dir is not None else Path(config.output_dir) / run_id
    result = Runner(config, path, console=console, show_progress=show_progress).run()
    return result, path


def resume_benchmark(run_dir: str | Path, *, console: Console | None = None, show_progress: bool = True,
                     drop: list[str] | None = None) -> tuple[RunResult, Path]:
    """Continue an interrupted run with the configuration it recorded, less the arms in `drop` (drop_arms)."""
    run = load_run(run_dir)
    if drop:
        run = drop_arms(Path(run_dir), run, drop)
    config = parse_run_config(run.conditions.config, source=f"{run_dir}/run.json")
    result = Runner(config, run_dir, resume=True, console=console, show_progress=show_progress).run()
    return result, Path(run_dir)


def drop_arms(run_dir: Path, run: RunResult, names: list[str]) -> RunResult:
    """The run without these arms, written back before it goes on: a run cut short for time finishes, and is
    priced, without them. Their records stay in requests.jsonl (nothing measured is deleted) and are no longer
    read: the ledger and the report read the arms run.json names. An arm that borrows its grading from a dropped
    one (lossless speculation on that target) must go too."""
    arms = [c.get("name") for c in run.conditions.config.get("configs", [])]
    unknown = [n for n in names if n not in arms]
    if unknown:
        raise BadInput(f"--drop {', '.join(unknown)}: not an arm of {run_dir} (its arms: {', '.join(map(str, arms))})")
    kept = [c for c in run.conditions.config["configs"] if c.get("name") not in names]
    if not kept:
        raise BadInput(f"--drop names every arm of {run_dir}: nothing would be left to run")
    whole = parse_run_config(run.conditions.config, source=f"{run_dir}/run.json")
    orphans = [bc.name for bc in whole.configs if bc.name not in names and whole.quality_source(bc) in names]
    if orphans:
        raise BadInput(f"{', '.join(orphans)} take their pass rate from an arm being dropped: --drop them too")
    from specledger.records.results import read_requests, write_run, write_summary

    left = sum(r.config in names for r in read_requests(run_dir))
    run.conditions.config = {**run.conditions.config, "configs": kept}
    run.configs = [c for c in run.configs if c.name not in names]
    run.notes.append(f"dropped {', '.join(names)} on resume ({left} of their records stay in requests.jsonl, unread)")
    write_run(run_dir, run)
    write_summary(run_dir, run)
    return run

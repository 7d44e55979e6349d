"""A run's configurations share loaded weights, in any role, through the process's model pool.

A model is kept while a later configuration of the run still needs it (the pool's one eviction rule,
applied as each in-process configuration starts), and released when the run ends. What is measured once
per target (its verification-cost curve, its agreement with the fp32 model) is a figure of this run, not a
cache: it is kept here for the run's later configurations, never across runs.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Collection

from rich.progress import Progress

from specledger.bench.backends.base import Backend
from specledger.records.config import BenchConfig, RunConfig
from specledger.bench.probes import UNQUANTIZED, ReferenceLogprobs, measure_agreement, needs_agreement, reference_logprobs
from specledger.records.results import ConfigResult, CurvePoint
from specledger.engine import threads
from specledger.engine.pool import Key, ModelPool, model_pool_key
from specledger.errors import SpecLedgerError

ReferenceFactory = Callable[[BenchConfig], Any]  # the unquantized model a quantized target is compared with


class SharedModels:
    def __init__(self, cfg: RunConfig, pool: ModelPool, reference_factory: ReferenceFactory | None = None):
        self.cfg = cfg
        self.pool = pool
        self.reference_factory = reference_factory
        self.mine: set[Key] = set()  # models this run put in the pool (others are the caller's)
        # the configurations whose models are kept as each one starts: the run's (default), a group's (bench/
        # memory_plan.py: arms that do not fit together), or one's own (a lean run: none kept for a later arm)
        self.scope: list[BenchConfig] = cfg.configs
        self.curves: dict[Key, list[dict]] = {}  # target -> verification-cost curve
        self.agreements: dict[Key, dict] = {}  # target -> agreement with the fp32 model
        self.references: dict[Key, ReferenceLogprobs] = {}  # the fp32 model -> what the gate needs of it

    def keys(self, bc: BenchConfig) -> dict[str, Key]:
        """Role -> the weights it holds while it runs (model, dtype, quant, group size, device, activations)."""
        return {role: model_pool_key(spec.model, spec.dtype, spec.quant, spec.group_size, bc.device, spec.activations)
                for role, spec in (("target", bc.target), ("draft", bc.draft), ("intermediate", bc.intermediate))
                if spec is not None}

    def reference_key(self, bc: BenchConfig) -> Key | None:
        """The fp32 model the quantization gate compares bc's target with (None: bc is not checked)."""
        if self.cfg.gates.quantization and needs_agreement(bc):
            return model_pool_key(bc.model, *UNQUANTIZED, bc.group_size, bc.device)
        return None

    def read_references(self, keep: Collection[Key] = ()) -> None:
        """Before any arm is loaded: each fp32 reference read once for its teacher-forced log-probabilities, then
        released unless `keep` holds it (an arm of the first group runs it), so the run's peak is one fp32 model
        alone, not one beside every arm (bench/memory_plan.py counts it so)."""
        for bc in self.cfg.configs:
            try:
                self.reference_figures(bc, keep)
            except SpecLedgerError:
                if not bc.optional:  # an optional arm that cannot start is skipped with its note later
                    raise

    def reference_figures(self, bc: BenchConfig, keep: Collection[Key] = ()) -> ReferenceLogprobs | None:
        """What the quantization gate needs of bc's reference: read once a run, its weights released after."""
        key = self.reference_key(bc)
        if key is None:
            return None
        if key not in self.references:
            self.references[key] = reference_logprobs(self.reference(bc))
            if key not in keep:
                self._drop({key} & self.mine)
        return self.references[key]

    def for_config(self, bc: BenchConfig) -> dict[str, Any]:
        """The loaded models bc can use, by role; first everything no configuration from bc on needs goes."""
        held = {role: self._get(k) for role, k in self.keys(bc).items()}  # (twins first)
        later = self.scope[self.scope.index(bc):] if bc in self.scope else [bc]
        self._drop(self.mine - {k for c in later if c.backend == "inprocess" for k in self.keys(c).values()})
        return {role: lm for role, lm in held.items() if lm is not None}

    def _get(self, key: Key) -> Any | None:
        """The model under `key`; else, for a quantized one, the pool's model of the same codes at the other
        activation bits, shared (engine/loader.activation_twin: W4A16 and W4A8 hold one copy of the weights)."""
        lm = self.pool.get(key)
        if lm is not None or key[2] == "none":
            return lm
        for bits in (16, 8):  # engine.quant.ACTIVATIONS (torch-free here)
            sibling = self.pool.get(key[:5] + (bits,) + key[6:])
            if bits != key[5] and sibling is not None:
                from specledger.engine.loader import activation_twin

                self.mine.add(key)
                return self.pool.put(key, activation_twin(sibling, key[5]))
        return None

    def keep(self, bc: BenchConfig, models: dict[str, Any]) -> None:
        """The models a started backend loaded, for later configurations."""
        for role, k in self.keys(bc).items():
            if role in models:
                self.pool.put(k, models[role])
                self.mine.add(k)

    def _load(self, bc: BenchConfig, role: str, **precision: Any) -> Any:
        """bc's model in `role` (target or reference), loaded into the pool now (in this thread) for the
        configurations that use it."""
        from specledger.engine.loader import load_model

        key = self.reference_key(bc) if role == "reference" else self.keys(bc)[role]
        assert key is not None
        self.mine.add(key)
        return self._get(key) or self.pool.load(key, lambda: load_model(bc.model, device=bc.device, **precision))

    def load_target(self, bc: BenchConfig) -> Any:
        return self._load(bc, "target", dtype=bc.dtype, quant=bc.quant, group_size=bc.group_size,
                          activations=bc.activations)

    def reference(self, bc: BenchConfig) -> Any:
        if self.reference_factory is not None:
            return self.reference_factory(bc)
        return self._load(bc, "reference", dtype=UNQUANTIZED[0], quant=UNQUANTIZED[1])

    def release(self) -> None:
        """The run is over: none of its models is needed any more."""
        self._drop(self.mine)

    def _drop(self, keys: set[Key]) -> None:
        """The pool's one rule: retain everything else (what was derived from these models goes with them)."""
        self.pool.retain(self.pool.keys() - keys)
        self.mine -= keys

    async def probe(self, bc: BenchConfig, backend: Backend, cr: ConfigResult, progress: Progress) -> None:
        """Once per target: its verification-cost curve and, unless it is the fp32 model, its agreement."""
        key = self.keys(bc)["target"] if bc.backend == "inprocess" else ("configuration", bc.name)
        lm = (getattr(backend, "models", None) or {}).get("target")
        curve = self.cfg.verify_curve and key not in self.curves
        agree = self.cfg.gates.quantization and needs_agreement(bc) and lm is not None and key not in self.agreements
        if curve or agree:
            what = " + ".join(w for w, on in (("verification-cost curve", curve), ("agreement with fp32", agree)) if on)
            task = progress.add_task(f"{bc.name}: {what}", total=None)
            try:
                if curve:
                    self.curves[key] = await backend.verify_curve() or []
                if agree:
                    ref = await asyncio.wrap_future(threads.future(self.reference_figures, bc))
                    self.agreements[key] = await asyncio.wrap_future(threads.future(measure_agreement, ref, lm))
            finally:
                progress.remove_task(task)
        cr.verify_curve = [CurvePoint(**p) for p in self.curves.get(key, [])] or cr.verify_curve
        cr.agreement = self.agreements.get(key, cr.agreement)

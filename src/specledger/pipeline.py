"""`specledger compare`, the main job: run a matrix of decoding configurations side by side, gate them,
price each accepted task and write the report.

The default matrix runs on the embedded model with the built-in workload. Every combination of
speculation and quantization in it is its own measured configuration (lookup on the fp32 and on the
W4A16 target, EAGLE on both), so the report's interaction table never multiplies speed-ups from
different runs. Strategies still landing (EAGLE needs a shipped head, the hierarchy its module) are
`optional`: when they cannot be built the harness skips them with a one-line note and runs the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from specledger.records.config import RunConfig, config_precision, load_run_config, parse_run_config
from specledger.records import durable
from specledger.records.results import REQUESTS_FILE, load_run, write_run
from specledger.errors import BadInput, SpecLedgerError

if TYPE_CHECKING:
    from specledger.records.results import RunResult
    from specledger.ledger.price import LedgerResult

EMBEDDED = "smollm2-135m"
FP32: dict[str, Any] = {"dtype": "fp32", "quant": "none"}
W8A16: dict[str, Any] = {"dtype": "bf16", "quant": "int8"}
W4A16: dict[str, Any] = {"dtype": "bf16", "quant": "int4", "group_size": 32}


@dataclass(frozen=True)
class Size:
    """How much to measure: sized so the default run takes ~10 minutes on 2 CPU cores, --quick ~3."""

    workload: dict[str, Any]
    max_tokens: int
    quick: bool
    quality_items: int  # graded items (bench/graded.py) per target precision: the pass rate's power
    concurrency: tuple[int, ...] = (1, 4)  # closed-loop levels swept: where each speculation method stops paying


# Speed: one MT-Bench category keeps the multi-turn kind (its first turn's answer is the second turn's
# context), one question of each other kind, 48 new tokens; every configuration runs them at concurrency 1
# (interleaved) and 4. Quality: 272 graded short-answer items per target precision (fp32, W8A16, W4A16;
# speculation is lossless, so it shares its target's pass rate): a 95% interval of at most +-6 points (1.96 x
# sqrt(0.25 / 272) = 5.9), at <= 16 tokens per answer, 16 items in flight (batched).
FULL = Size({"spec": "builtin", "categories": ["writing", "translation", "summarization", "qa", "math_reasoning",
                                               "rag"], "per_category": 1}, max_tokens=48, quick=False,
            quality_items=272)
QUICK = Size({"spec": "builtin-quick"}, max_tokens=32, quick=True, quality_items=40)


def _config(size: Size, model: str, name: str, strategy: str, precision: dict[str, Any],
            **extra: Any) -> dict[str, Any]:
    return {"name": name, "model": model, "strategy": strategy, **precision, "max_tokens": size.max_tokens, **extra}


def _matrix(size: Size, configs: list[dict[str, Any]], source: str) -> RunConfig:
    """Configurations over the size's workload, concurrency sweep and graded quality items."""
    data = {"configs": configs, "workload": size.workload, "output_dir": "runs",
            "load": {"concurrency": list(size.concurrency), "warmup_max_tokens": 16},
            "quality": {"spec": "builtin-graded", "limit": size.quality_items}}
    return parse_run_config(data, source=source)


def default_configs(size: Size, model: str = EMBEDDED) -> list[dict[str, Any]]:
    """The default matrix, named <strategy>-<target precision>, ordered so loaded weights are reused.

    --quick keeps the smallest set that still shows the interaction: autoregressive and prompt lookup,
    each on the fp32 and on the W4A16 target.
    """
    cfg = partial(_config, size, model)
    if size.quick:
        return [cfg("ar-fp32", "ar", FP32), cfg("lookup-fp32", "lookup", FP32),
                cfg("ar-w4", "ar", W4A16), cfg("lookup-w4", "lookup", W4A16)]
    return [
        cfg("ar-fp32", "ar", FP32),
        cfg("lookup-fp32", "lookup", FP32),
        cfg("eagle-fp32", "eagle", FP32, optional=True),
        cfg("draft-fp32", "draft", FP32, draft={"model": model, **W4A16}),  # a chain from the W4A16 copy
        cfg("ar-w8", "ar", W8A16),
        cfg("ar-w4", "ar", W4A16),
        cfg("lookup-w4", "lookup", W4A16),
        cfg("eagle-w4", "eagle", W4A16, optional=True),
        # HierSpec's shape: the wide EAGLE tree is verified by an intermediate whose forward grows least with
        # the tokens verified (on a CPU the bf16 copy: ~1.7x from 1 to 32 tokens, W4A16 ~6x, fp32 ~4x), and the
        # W4A16 target, fastest for one token, verifies only the resulting chain.
        cfg("hier-w4", "hier", W4A16, intermediate={"model": model, "dtype": "bf16", "quant": "none"}, optional=True),
    ]


def default_matrix(*, quick: bool = False, max_tokens: int | None = None, model: str = EMBEDDED) -> RunConfig:
    size = QUICK if quick else FULL
    return with_max_tokens(_matrix(size, default_configs(size, model), "default matrix"), max_tokens)


def arm_strategies() -> list[str]:
    """The strategies `compare --arms` takes: those that draft in a continuous batch (where draft_length acts)."""
    from specledger.decoding.params import STRATEGIES

    return [s for s in STRATEGIES if s != "ar"]


def arms_matrix(strategy: str, *, quick: bool = False, model: str = EMBEDDED) -> RunConfig:
    """Three arms side by side on one target (fp32; a hierarchy's W4A16), the protocol production engines show adaptive speculation
    with: no speculation (`ar`), the strategy drafting a fixed K every step (`<strategy>-fixed`, K its
    max_nodes) and the cost-aware planner (`<strategy>-adaptive`); each arm greedy, so the
    lossless gate holds it to `ar`'s outputs and it shares `ar`'s graded pass rate, swept over the concurrency
    levels (where fixed K stops paying and the planner should not)."""
    if strategy not in arm_strategies():
        raise BadInput(f"--arms takes a strategy that drafts in a batch ({', '.join(arm_strategies())}), "
                       f"got {strategy!r}")
    size = QUICK if quick else FULL
    # as in the default matrix: a draft model is the W4A16 copy; a hierarchy verifies its tree on the bf16 copy
    # and the chain on the W4A16 target
    roles: dict[str, Any] = {"draft": {"draft": {"model": model, **W4A16}},
                             "hier": {"intermediate": {"model": model, "dtype": "bf16", "quant": "none"}}
                             }.get(strategy, {})
    precision = W4A16 if strategy == "hier" else FP32
    configs = [_config(size, model, "ar", "ar", precision)] + [
        _config(size, model, f"{strategy}-{policy}", strategy, precision, params={"draft_length": policy}, **roles)
        for policy in ("fixed", "adaptive")]
    return _matrix(size, configs, f"--arms {strategy}")


def with_max_tokens(config: RunConfig, max_tokens: int | None) -> RunConfig:
    """Every configuration's answer length capped the same (a workload's own limit still wins)."""
    if max_tokens is None:
        return config
    data = config.model_dump(mode="json")
    for c in data["configs"]:
        c["max_tokens"] = max_tokens
    return parse_run_config(data, source="--max-tokens")


def build_config(config_file: Path | None, *, quick: bool, max_tokens: int | None,
                 workload: dict[str, Any] | None = None, load: dict[str, Any] | None = None,
                 arms: str | None = None) -> RunConfig:
    """The default matrix, the file's or a strategy's three arms, with --max-tokens and any workload / load
    settings given."""
    if arms is not None and config_file is not None:
        raise BadInput("--arms and --config each give the configurations: give one of them")
    if arms is not None:
        config = arms_matrix(arms, quick=quick)
    else:
        config = default_matrix(quick=quick) if config_file is None else load_run_config(config_file)
    workload = {k: v for k, v in (workload or {}).items() if v is not None}
    load = {k: v for k, v in (load or {}).items() if v is not None}
    if workload or load:
        data = config.model_dump(mode="json", exclude_unset=True)
        if workload.get("spec"):  # a new workload: the default matrix's selection was for the built-in set
            data["workload"] = {"spec": workload["spec"]}
        own_sample = data.get("workload", {}).get("sample")  # the timed set's own size, before --sample
        data.setdefault("workload", {}).update(workload)
        quality = data.get("quality") or {}
        from specledger.bench.datasets import KNOWN_WORKLOADS

        if workload.get("spec") in KNOWN_WORKLOADS and quality:  # code graded by its tests: the quality that prices
            data["quality"] = quality = {k: v for k, v in quality.items() if k not in ("limit", "sample")} | \
                {"spec": workload["spec"]}
        if workload.get("sample") and quality.get("spec") == data["workload"].get("spec"):
            # graded on the same set (a code recipe): --sample N is the graded items; the timed levels keep a
            # smaller set of their own (the recipe's 8), or take N
            quality["sample"] = workload["sample"]
            data["workload"]["sample"] = min(workload["sample"], own_sample or workload["sample"])
        if load:
            data["load"] = {k: v for k, v in data.get("load", {}).items()
                            if k not in ("concurrency", "rate", "replay")} | load
        config = parse_run_config(data, source="command line")
    return with_max_tokens(config, max_tokens)


def default_run_dir(config: RunConfig) -> Path:
    return Path(config.output_dir) / (config.run_id or f"compare-{time.strftime('%Y%m%d-%H%M%S')}")


@dataclass
class Outcome:
    run: RunResult
    run_dir: Path
    ledger: LedgerResult
    report: Path | None
    elapsed_s: float


def plan_table(config: RunConfig) -> Table:
    from specledger.records.pairing import precision_label

    t = Table(title="Configurations", title_justify="left", header_style="bold")
    for col in ("name", "strategy", "target", "drafter / intermediate", "max new tokens"):
        t.add_column(col)
    for c in config.configs:
        roles = [f"{role} {spec.model} {precision_label(spec.dtype, spec.quant, spec.group_size, spec.activations)}"
                 for role, spec in (("draft", c.draft), ("intermediate", c.intermediate)) if spec is not None]
        if c.openai is not None and c.openai.server is not None and c.openai.server.draft_model:
            roles.append(f"draft {c.openai.server.draft_model} (the server's)")
        roles += [f"{k}={v}" for k, v in c.params.given().items()]
        t.add_row(c.name + (" [dim](if available)[/dim]" if c.optional else ""), c.strategy,
                  f"{c.model} {config_precision(c)}", ", ".join(roles) or "–",
                  str(c.max_tokens))
    return t


def run_compare(config: RunConfig, *, run_dir: Path | None = None, inputs: Path | None = None,
                report: bool = True, samples: int = 2000, console: Console | None = None,
                show_progress: bool = True) -> Outcome:
    """Measure (with gates), price, print the cost table, write the report."""
    from specledger.bench.runner import run_benchmark
    from specledger.bench.tables import gates_text, workload_text
    from specledger.bench.workload import open_settings
    from specledger.ledger.inputs import load_inputs
    from specledger.ledger.price import price_run
    from specledger.report.html import write_report
    from specledger.report.terminal import print_ledger, render_answer, render_interaction

    console = console or Console()
    t0 = time.perf_counter()
    costs = load_inputs(inputs)  # a bad cost file fails now, not after the measurements
    w = config.workload
    questions = open_settings(w).questions
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
    if (run_dir / REQUESTS_FILE).exists():
        raise BadInput(f"{run_dir} already holds a run; choose another --out directory")
    console.print(plan_table(config))
    cap = config.load.warmup_max_tokens
    console.print(f"workload {w.spec}: {len(questions)} questions, {sum(len(q.turns) for q in questions)} turns "
                  f"(+{config.load.warmup} warm-up per configuration{f', ≤{cap} tokens' if cap else ''}); "
                  f"results in {run_dir}")
    if config.quality is not None:
        # with a quality gate every configuration has a source (None only without one)
        reps = sorted({src for c in config.configs if (src := config.quality_source(c)) is not None})
        console.print(f"quality: {config.quality.spec}, {config.quality.limit or 'all'} graded items for "
                      f"{', '.join(reps)} (the others are lossless on one of these targets)")
    try:
        run, run_dir = run_benchmark(config, run_dir=run_dir, console=console, show_progress=show_progress)
    except SpecLedgerError as exc:
        if (run_dir / "run.json").exists():
            raise SpecLedgerError(f"{exc} (what was measured is in {run_dir})") from None
        raise
    measured = f"{time.perf_counter() - t0:.0f} s"
    try:
        with console.status("pricing…"):
            ledger = price_run(run_dir, costs, samples=samples, seed=config.seed)
    except SpecLedgerError as exc:
        raise SpecLedgerError(f"{exc} (the measurements are in {run_dir})") from None
    durable.write_text(run_dir / "ledger.json", ledger.model_dump_json(indent=2))
    if ledger.answer is not None:  # run.json leads with the decision too
        run = load_run(run_dir)
        run.answer = ledger.answer.model_dump(mode="json")
        write_run(run_dir, run)
    answer = render_answer(ledger)
    if answer is not None:  # the decision first; the gates, tables and report are its evidence
        console.print(answer)
    console.print("[bold]Quality gates[/bold]")
    console.print(gates_text(run))  # every gate's figures, divergences included, and the run's notes
    console.print(workload_text(run))  # what was read and skipped, and how each kind is graded
    if run.noise is not None and run.noise.warning:
        console.print(f"[yellow]warning: noisy machine: {run.noise.warning}.[/yellow]")
    print_ledger(ledger, console, answer=False)
    inter = render_interaction(ledger)
    if inter is not None:
        console.print(inter)
    path = None
    if report:
        path = write_report(run_dir, ledger, run_dir / "report.html")
    elapsed = time.perf_counter() - t0
    if ledger.answer is not None and ledger.answer.scenarios:  # the answer again, last on the screen
        console.print(f"[bold]answer:[/bold] {ledger.answer.scenarios[0].headline}")
    console.print(f"measured in {measured}, done in {elapsed:.0f} s; results: {run_dir.resolve()}")
    if path is not None:
        console.print(f"report: {path.resolve()}")
    return Outcome(run=run, run_dir=run_dir, ledger=ledger, report=path, elapsed_s=elapsed)

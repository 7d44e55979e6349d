"""`specledger report` (price a run, write the HTML report) and `specledger compare` (the main job:
measure, gate, price, report)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specledger.cli.bench import _floats


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        run_dir: Path = typer.Argument(..., help="results directory of a benchmark run"),
        inputs: Optional[Path] = typer.Option(None, "--inputs", "-i", help="cost inputs (YAML); default: the documented defaults"),
        out: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file to write (default RUN_DIR/report.html)"),
        samples: int = typer.Option(2000, "--samples", min=0, help="Monte Carlo samples"),
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """One HTML file: cost table, calculator, break-even, sensitivity, speed and latency charts; ledger.json (what
        it shows, in full) beside it."""
        from rich.console import Console

        from specledger.ledger.price import price_run
        from specledger.records import durable
        from specledger.report.html import write_report
        from specledger.report.terminal import render_cost_table

        console = Console()
        with console.status("pricing and drawing the report…"):
            ledger = price_run(run_dir, inputs, samples=samples, seed=seed)
            target = out or Path(run_dir) / "report.html"
            target.parent.mkdir(parents=True, exist_ok=True)
            # the report links the ledger it shows: written first, beside it (in the run directory: replacing the
            # ledger.json of another pricing, which the new report would contradict)
            durable.write_text(target.parent / "ledger.json", ledger.model_dump_json(indent=2))
            path = write_report(run_dir, ledger, target)
        console.print(render_cost_table(ledger))
        console.print(f"report: {path.resolve()}")

    @app.command("compare")
    def compare_cmd(
        quick: bool = typer.Option(False, "--quick",
                                   help="~2 minutes: 4 configurations, one question per task kind, 32 tokens"),
        out: Optional[Path] = typer.Option(None, "--out", "-o",
                                           help="run directory for results and report (default runs/compare-TIME)"),
        inputs: Optional[Path] = typer.Option(None, "--inputs", "-i",
                                              help="cost inputs (YAML); default: the documented defaults"),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", "--max-new-tokens", min=1,
                                                     help="per answer, every configuration"),
        config: Optional[Path] = typer.Option(None, "--config", "-c",
                                              help="run configuration (YAML/TOML) instead of the default matrix"),
        arms: Optional[str] = typer.Option(None, "--arms", metavar="STRATEGY",
                                           help="instead of the default matrix, three arms side by side: ar (no "
                                                "speculation), STRATEGY drafting a fixed K every step "
                                                "(draft_length=fixed) and STRATEGY with the adaptive planner, "
                                                "each gated against ar; STRATEGY: lookup, draft, eagle or hier"),
        workload: Optional[str] = typer.Option(None, "--workload", "-w",
                                               help="your workload instead of the built-in set: humaneval (once "
                                                    "fetched: `specledger workloads --fetch humaneval`), PATH "
                                                    "(format detected) or FORMAT:PATH (spec-bench, sharegpt, chat, "
                                                    "csv, text, trace, code)"),
        limit: Optional[int] = typer.Option(None, "--limit", min=1, help="first N questions"),
        sample: Optional[int] = typer.Option(None, "--sample", min=1, help="a seeded random sample of N questions"),
        per_category: Optional[int] = typer.Option(None, "--per-category", min=1, help="N questions per category"),
        kind: Optional[str] = typer.Option(None, "--kind", help="task kind of records without one"),
        prompt_column: Optional[str] = typer.Option(None, "--prompt-column", help="CSV: the prompt column"),
        on_bad_line: Optional[str] = typer.Option(None, "--on-bad-line", help="stop | skip a malformed line"),
        replay: Optional[str] = typer.Option(None, "--replay", help="replay a trace at these speeds, e.g. 1"),
        no_report: bool = typer.Option(False, "--no-report", help="skip the HTML report"),
        samples: int = typer.Option(2000, "--samples", min=0, help="Monte Carlo samples"),
        no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
        repeats: int = typer.Option(1, "--repeats", min=1, help="passes over the workload (interleaved)"),
        concurrency: Optional[str] = typer.Option(None, "--concurrency",
                                                  help="closed-loop levels to sweep, e.g. 1,4 (the default matrix's)"),
        threads: Optional[int] = typer.Option(None, "--threads", min=1,
                                              help="torch threads (default: chosen by a short probe; recorded)"),
        sustain: Optional[str] = typer.Option(None, "--sustain", metavar="DURATION",
                                              help="hold each load level until its throughput is steady or "
                                                   "DURATION (e.g. 300, 5m) ends; reports burst vs steady state"),
        cpu_watts: Optional[float] = typer.Option(None, "--cpu-watts", min=0.001,
                                                  help="power of one busy logical CPU (W) for the energy estimate "
                                                       "where the machine has no RAPL/NVML counter"),
    ) -> None:
        """The main job: run the configurations side by side (default: the embedded model's matrix), apply the
        quality gates, price each accepted task, print the table and write the report."""
        from specledger.bench.steady import sustain_settings
        from specledger.pipeline import build_config, run_compare

        run_config = build_config(
            config, quick=quick, max_tokens=max_tokens, arms=arms,
            workload={"spec": workload, "limit": limit, "sample": sample, "per_category": per_category,
                      "kind": kind, "prompt_column": prompt_column, "on_bad_line": on_bad_line},
            load={"replay": _floats(replay, "replay"),
                  "concurrency": [int(c) for c in _floats(concurrency, "concurrency") or []] or None,
                  "steady_state": sustain_settings(sustain)})
        if repeats > 1 or threads is not None or cpu_watts is not None:
            run_config = run_config.model_copy(update={"repeats": repeats, "threads": threads, "cpu_watts": cpu_watts})
        run_compare(run_config, run_dir=out, inputs=inputs, report=not no_report, samples=samples,
                    show_progress=not no_progress)

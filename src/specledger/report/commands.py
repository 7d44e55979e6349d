"""`specledger report`: price a run and write the self-contained HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        run_dir: Path = typer.Argument(..., help="results directory of a benchmark run"),
        inputs: Optional[Path] = typer.Option(None, "--inputs", "-i", help="cost inputs (YAML); default: the documented defaults"),
        out: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file to write (default RUN_DIR/report.html)"),
        samples: int = typer.Option(2000, "--samples", min=0, help="Monte Carlo samples"),
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """One HTML file: cost table, calculator, break-even, sensitivity, speed and latency charts."""
        from rich.console import Console

        from specledger.ledger.price import price_run
        from specledger.report.html import write_report
        from specledger.report.terminal import render_cost_table

        console = Console()
        with console.status("pricing and drawing the report…"):
            ledger = price_run(run_dir, inputs, samples=samples, seed=seed)
            path = write_report(run_dir, ledger, out or Path(run_dir) / "report.html")
        console.print(render_cost_table(ledger))
        console.print(f"report: {path.resolve()}")

"""`specledger cost` and `specledger break-even`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specledger.errors import BadInput
from specledger.records import durable


def register(app: typer.Typer) -> None:
    @app.command("cost")
    def cost(
        target: Optional[Path] = typer.Argument(None, help="RUN_DIR to price; with --init, the file to write (default cost.yaml)"),
        inputs: Optional[Path] = typer.Option(None, "--inputs", "-i", help="cost inputs (YAML); default: the documented defaults"),
        json_out: Optional[Path] = typer.Option(None, "--json", help="also write the full result as JSON"),
        init: bool = typer.Option(False, "--init", help="write a commented example cost file and exit"),
        force: bool = typer.Option(False, "--force", help="with --init, overwrite an existing file"),
        samples: int = typer.Option(2000, "--samples", min=0, help="Monte Carlo samples (0: point estimates only)"),
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """Price each configuration of a run: cost per accepted task, interval, verdict."""
        from specledger.ledger.inputs import example_text

        if init:
            path = target or Path("cost.yaml")
            if path.exists() and not force:
                raise BadInput(f"{path} exists (use --force to overwrite)")
            try:
                path.write_text(example_text(), encoding="utf-8")
            except OSError as exc:
                raise BadInput(f"--init {path}: cannot write it ({exc.strerror or exc})") from None
            typer.echo(f"wrote {path}")
            return
        if target is None:
            raise BadInput("cost: give a RUN_DIR (or --init [PATH] to write an example cost file)")
        from specledger.ledger.price import price_run
        from specledger.report.terminal import print_ledger

        ledger = price_run(target, inputs, samples=samples, seed=seed)
        print_ledger(ledger)
        if json_out is not None:
            try:
                json_out.parent.mkdir(parents=True, exist_ok=True)
                durable.write_text(json_out, ledger.model_dump_json(indent=2))
            except OSError as exc:
                raise BadInput(f"--json {json_out}: cannot write it ({exc.strerror or exc})") from None
            typer.echo(f"wrote {json_out}")

    @app.command("break-even")
    def break_even_cmd(
        run_dir: Path = typer.Argument(..., help="results directory"),
        config_a: str = typer.Argument(..., help="the configuration whose input moves"),
        config_b: str = typer.Argument(..., help="the configuration it is compared with"),
        field: str = typer.Argument(..., help="pass_rate | device_seconds_per_call | concurrency | an inputs path, e.g. acceptance.review_minutes"),
        inputs: Optional[Path] = typer.Option(None, "--inputs", "-i"),
        low: Optional[float] = typer.Option(None, "--low"),
        high: Optional[float] = typer.Option(None, "--high"),
    ) -> None:
        """The value of one input at which two configurations cost the same per accepted task."""
        from specledger.ledger.breakeven import break_even
        from specledger.ledger.price import cases_for

        cases = cases_for(run_dir, inputs)
        for name in (config_a, config_b):
            if name not in cases:
                raise BadInput(f"no configuration named '{name}' in {run_dir} (have: {', '.join(cases)})")
        b = break_even(cases[config_a], cases[config_b], field, low, high)
        now = "" if b.current is None else f" (now {b.current:.4g})"
        if b.value is None:
            typer.echo(f"{field}{now}: no break-even in [{b.lo:.4g}, {b.hi:.4g}]: {b.note}")
        else:
            typer.echo(f"{field}{now}: break-even at {b.value:.6g}; {b.note}")

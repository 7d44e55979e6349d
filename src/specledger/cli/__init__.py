"""The `specledger` command: one module per command group in this package, on top of the areas (which never
import it); errors become one line."""

from __future__ import annotations

import sys

import typer

from specledger.cli import bench, decoding, engine, ledger, report, server, train
from specledger.errors import SpecLedgerError

app = typer.Typer(
    name="specledger",
    help="Measure decoding configurations (speculation, quantization) side by side and price each accepted task.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# The areas never import this package; it imports them. The order here is the order in `--help`.
for _group in (engine, decoding, train, bench, ledger, report, server):
    _group.register(app)


def main() -> None:
    try:
        app()
    except SpecLedgerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


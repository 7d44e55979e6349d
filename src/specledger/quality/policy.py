"""Gate policy for a benchmark run: which gates a configuration gets, against what, with which thresholds.

quality/gates.py holds the gates themselves (pure functions of outputs and figures); this module decides,
per configuration of a run, which reference the lossless gate compares with, which records the pass rate
counts, when failed requests make a configuration not comparable, and writes the outcomes to the results.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from specledger.records.config import QUALITY_LEVEL, BenchConfig, RunConfig, config_baselines
from specledger.records.results import group_by
from specledger.records.results import GateOutcome, RequestRecord, RunResult
from specledger.quality.gates import comparable, lossless_gate, pass_rate_gate, quantization_gate


def _outputs(records: list[RequestRecord]) -> tuple[dict[str, list[int]], bool]:
    """Greedy outputs keyed by load|item|turn: token ids where known, else the text's characters."""
    ok = [r for r in records if r.status == "ok"]
    ids = all(r.output_token_ids is not None for r in ok)
    out = {f"{r.load}|{r.item}|t{r.turn}": ((r.output_token_ids or []) if ids else [ord(ch) for ch in r.output_text])
           for r in ok}
    return out, ids


def apply_gates(run: RunResult, records: list[RequestRecord], cfg: RunConfig) -> None:
    """Lossless (greedy, vs the `ar` configuration of the same target and precision), quantization (agreement
    with the fp32 model, when measured) and pass rate."""
    by_config = group_by(records, "config")
    specs = {c.name: c for c in cfg.configs}
    pairs = config_baselines(cfg.configs)
    for cr in run.configs:
        bc = specs.get(cr.name)
        recs = by_config.get(cr.name, [])
        gates: list[GateOutcome] = []
        if bc is not None and bc.strategy != "ar":
            ref = specs.get(pairs.get(bc.name, ""))
            if not bc.greedy or ref is None:
                why = ("sampling (temperature > 0); checked on greedy runs" if not bc.greedy else
                       "no greedy 'ar' configuration of the same target and precision in this run")
                gates.append(GateOutcome(name="lossless", passed=None, reason=f"not checked: {why}"))
            elif ref.name in by_config and recs:
                ref_out, ref_ids = _outputs([r for r in by_config[ref.name] if r.load != QUALITY_LEVEL])
                cand_out, cand_ids = _outputs([r for r in recs if r.load != QUALITY_LEVEL])
                sixteen = bc.dtype in ("bf16", "fp16")
                min_share = cfg.gates.lossless_min_share_16bit if sixteen else cfg.gates.lossless_min_share
                g = lossless_gate(ref_out, cand_out, min_share=min_share)
                if sixteen and g.figures.get("first_divergence") and g.passed:
                    g.reason += f" ({bc.dtype} rounding: at least {min_share:.0%} identical required)"
                g.figures["reference"] = ref.name
                g.figures["compared_on"] = "token ids" if ref_ids and cand_ids else "text characters"
                gates.append(g)
        if cr.agreement is not None and cfg.gates.quantization:
            gates.append(quantization_outcome(cr.agreement, cfg))
        source = cfg.quality_source(bc) if bc is not None else None
        if source is not None:  # the graded quality level (of this configuration or its lossless reference)
            graded = pass_rate_sample([r for r in by_config.get(source, []) if r.load == QUALITY_LEVEL], bc)
            graded = graded or pass_rate_sample(recs, bc)
        else:
            graded = pass_rate_sample(recs, bc)
        # a failed request is a failed attempt: not accepted, in the denominator (when anything was graded)
        outcomes = [r.grade.passed if r.grade else None for r in graded if r.status == "ok"]
        if any(o is not None for o in outcomes):
            outcomes += [False for r in graded if r.status != "ok"]
        pr = pass_rate_gate(outcomes, min_rate=cfg.gates.min_pass_rate)
        gates.append(pr)
        if any(r.status != "ok" for r in recs):
            gates.append(failure_gate(recs, cfg.gates.max_failure_rate))
        cr.pass_rate = pr.figures.get("rate")
        cr.pass_ci = (pr.figures["ci_low"], pr.figures["ci_high"]) if pr.figures.get("graded") else None
        cr.gates = gates
        cr.comparable, cr.comparable_reason = comparable(gates)


def failure_gate(records: list[RequestRecord], max_rate: float) -> GateOutcome:
    """Requests that failed (after retries), by kind; above max_rate the configuration is not comparable:
    its figures would rest on the requests that happened to succeed."""
    failed = [r for r in records if r.status != "ok"]
    rate = len(failed) / len(records) if records else 0.0
    kinds = Counter(r.error_kind or "other" for r in failed)
    detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    summary = f"{len(failed)}/{len(records)} requests failed ({rate:.1%}: {detail})"
    passed = rate <= max_rate
    reason = f"{summary}, {'within' if passed else 'above'} the maximum {max_rate:.0%}"
    return GateOutcome(name="failures", passed=passed, reason=reason,
                       figures={"failed": len(failed), "requests": len(records), "rate": rate, "kinds": dict(kinds),
                                "max_rate": max_rate})


def quantization_outcome(agreement: dict[str, Any], cfg: RunConfig) -> GateOutcome:
    g = quantization_gate(agreement["top1_agreement"], agreement["mean_kl"], min_agreement=cfg.gates.min_agreement,
                          max_kl=cfg.gates.max_kl)
    g.figures |= {k: agreement.get(k) for k in ("reference", "tokens", "ppl_reference", "ppl_candidate")}
    g.reason += f" vs {agreement.get('reference')}, teacher-forced over {agreement.get('tokens')} tokens"
    return g


def pass_rate_sample(records: list[RequestRecord], bc: BenchConfig | None) -> list[RequestRecord]:
    """Graded conversations, and every failed request (each a failed attempt; a conversation stops at its
    first failure). Greedy outputs repeat across load levels, so count each graded question once."""
    last = [r for r in records if r.turn == r.turns and r.status == "ok"]
    failed = [r for r in records if r.status != "ok"]
    if bc is None or not bc.greedy:
        return last + failed
    seen: dict[str, RequestRecord] = {}
    for r in sorted(last, key=lambda r: (r.load, r.item)):
        seen.setdefault(r.question_id, r)
    return list(seen.values()) + failed

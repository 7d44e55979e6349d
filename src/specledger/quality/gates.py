"""Quality gates: may two configurations' costs be compared at all?

A speed-up bought with different outputs or a lower pass rate is not a speed-up at equal quality; each gate
states what it measured (figures, JSON-serialisable) and, when it fails, why. `comparable` folds them.
"""

from __future__ import annotations

import math

from specledger.records.results import GateOutcome


def _gate(name: str, passed: bool, reason: str, figures: dict) -> GateOutcome:
    return GateOutcome(name=name, passed=passed, reason=reason, figures=figures)


def wilson_interval(passes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; sane at 0/n and n/n where the normal one is not."""
    if n < 0 or not 0 <= passes <= n:
        raise ValueError(f"need 0 <= passes <= n, got passes={passes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = passes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_rate_gate(results: list[bool | None], *, min_rate: float | None = None) -> GateOutcome:
    """Pass rate over graded questions (None = ungraded, left out) with its 95% Wilson interval.

    Fails only when `min_rate` is set and the observed rate is below it (or nothing was graded).
    """
    graded = [r for r in results if r is not None]
    n, passes = len(graded), sum(1 for r in graded if r)
    low, high = wilson_interval(passes, n)
    figures = {"passes": passes, "graded": n, "ungraded": len(results) - n, "rate": passes / n if n else None,
               "ci_low": low, "ci_high": high, "confidence": 0.95, "min_rate": min_rate}
    if n == 0:
        ok = min_rate is None
        return _gate("pass_rate", ok, "no graded answers" + ("" if ok else f", minimum {min_rate:.2f}"), figures)
    rate = passes / n  # n > 0 from here on
    summary = f"{passes}/{n} passed ({rate:.1%}, 95% CI {low:.1%}-{high:.1%})"
    if min_rate is None:
        return _gate("pass_rate", True, summary, figures)
    if rate < min_rate:
        return _gate("pass_rate", False, f"{summary} below the minimum {min_rate:.1%}", figures)
    return _gate("pass_rate", True, f"{summary}, minimum {min_rate:.1%}", figures)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix of the other); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def lossless_gate(reference: dict[str, list[int]], candidate: dict[str, list[int]], *,
                  min_share: float = 1.0) -> GateOutcome:
    """Greedy token ids of a strategy vs autoregressive decoding of the same target and precision, per request.

    Requests present on one side only are counted, not compared. In bf16/fp16 a few divergences are expected
    (k-token and 1-token passes round differently); `min_share` < 1 tolerates them, the figures still show them.
    """
    keys = [k for k in reference if k in candidate]
    positions: dict[str, int] = {}
    for key in keys:
        pos = first_divergence(list(reference[key]), list(candidate[key]))
        if pos is not None:
            positions[key] = pos
    n, identical = len(keys), len(keys) - len(positions)
    divs = [positions[k] for k in keys if k in positions]
    missing_in_candidate = sorted(k for k in reference if k not in candidate)
    figures = {"compared": n, "identical": identical, "share_identical": identical / n if n else None,
               "first_divergence": divs, "first_divergence_mean": sum(divs) / len(divs) if divs else None,
               "first_divergence_min": min(divs) if divs else None, "diverged": [k for k in keys if k in positions],
               "missing_in_candidate": missing_in_candidate,
               "missing_in_reference": sorted(k for k in candidate if k not in reference)}
    missing = len(missing_in_candidate)
    note = f"; {missing} request(s) missing from the candidate" if missing else ""
    if n == 0:
        return _gate("lossless", False, "no request in common with the reference run", figures)
    if not divs:
        return _gate("lossless", True, f"{n}/{n} outputs identical to the reference{note}", figures)
    share = identical / n  # n > 0 from here on
    summary = (
        f"{identical}/{n} outputs identical ({share:.0%}); first divergence at token "
        f"{min(divs)} (mean {figures['first_divergence_mean']:.1f}){note}"
    )
    return _gate("lossless", share >= min_share, summary, figures)


def quantization_gate(top1_agreement: float, mean_kl: float, *, min_agreement: float = 0.95,
                      max_kl: float | None = None) -> GateOutcome:
    """Teacher-forced top-1 agreement (and optionally mean KL) of a quantized model vs the unquantized one."""
    if not 0.0 <= top1_agreement <= 1.0:
        raise ValueError(f"top1_agreement must lie in [0, 1], got {top1_agreement}")
    if mean_kl < 0 or math.isnan(mean_kl):
        raise ValueError(f"mean_kl must be >= 0, got {mean_kl}")
    figures = {"top1_agreement": top1_agreement, "mean_kl": mean_kl, "min_agreement": min_agreement, "max_kl": max_kl}
    problems = []
    if top1_agreement < min_agreement:
        problems.append(f"top-1 agreement {top1_agreement:.1%} below {min_agreement:.1%}")
    if max_kl is not None and mean_kl > max_kl:
        problems.append(f"mean KL {mean_kl:.4f} above {max_kl:.4f}")
    if problems:
        return _gate("quantization", False, "; ".join(problems), figures)
    return _gate("quantization", True, f"top-1 agreement {top1_agreement:.1%}, mean KL {mean_kl:.4f}", figures)


def comparable(gates: list[GateOutcome]) -> tuple[bool, str]:
    """(False, reasons) if any gate failed, else (True, ""); a gate not checked (passed None) is no failure."""
    failed = [g for g in gates if g.passed is False]
    if not failed:
        return True, ""
    return False, "; ".join(f"{g.name}: {g.reason}" for g in failed)

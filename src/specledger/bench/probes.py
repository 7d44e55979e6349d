"""Measurements of a target model itself, taken once per run beside the requests.

- The verification-cost curve: forward time of n new tokens on top of a cached context. The cost
  of a speculative step is (d·T_draft + T_verify(n)) / τ, so how T_verify grows with n decides
  whether a tree pays on this model, precision and device; the report plots it.
- Teacher-forced agreement with the unquantized model (top-1 agreement, KL, perplexity): what the
  quantization gate judges, so a cheaper precision that is no longer the same model is marked as
  not comparable.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from specledger.bench.config import BenchConfig

CURVE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
UNQUANTIZED = ("fp32", "none")  # (dtype, quant) of the reference the quantization gate compares with


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def measure_verify_curve(lm: Any, *, context: int = 256, sizes: tuple[int, ...] = CURVE_TOKENS,
                         reps: int = 5) -> list[dict[str, float]]:
    """[{tokens, ms}]: one causal forward (with logits for every position, as a verifier needs) of n new
    tokens after `context` cached ones; the median of `reps` rounds after one unmeasured round. Each round
    visits every size, so a burst of load from elsewhere on the machine hits one round, not one size."""
    import torch

    m = lm.model
    dev = m.device
    sizes = tuple(n for n in sizes if n < m.cfg.max_seq_len)
    context = max(1, min(context, m.cfg.max_seq_len - max(sizes)))
    gen = torch.Generator().manual_seed(0)
    cache = m.new_cache(context + max(sizes))
    xs = {n: torch.randint(0, m.cfg.vocab_size, (1, n), generator=gen).to(dev) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with torch.inference_mode():
        m.hidden(torch.randint(0, m.cfg.vocab_size, (1, context), generator=gen).to(dev), cache)
        for rep in range(reps + 1):
            for n in sizes:
                cache.rollback(context)
                _sync(dev)
                t0 = time.perf_counter()
                m.logits(m.hidden(xs[n], cache))
                _sync(dev)
                if rep:
                    times[n].append(time.perf_counter() - t0)
    return [{"tokens": n, "ms": round(1000 * statistics.median(times[n]), 3)} for n in sizes]


def needs_agreement(bc: BenchConfig) -> bool:
    """In-process targets other than the unquantized fp32 model are checked against it."""
    return bc.backend == "inprocess" and (bc.dtype, bc.quant) != UNQUANTIZED


def measure_agreement(reference: Any, candidate: Any, text: str | None = None, max_tokens: int = 1024) -> dict:
    """Teacher-forced figures of `candidate` vs `reference` over a fixed text (the package's quality text)."""
    from specledger.quality.agreement import compare, default_text

    tok = candidate.tokenizer or reference.tokenizer
    ids = tok.encode(text if text is not None else default_text())[:max_tokens]
    a = compare(reference, candidate, ids)
    a.mean_kl = max(0.0, a.mean_kl)  # identical distributions can round to -1e-15
    return {"reference": getattr(reference, "label", reference.name), "candidate": getattr(candidate, "label", ""),
            **a.as_dict()}

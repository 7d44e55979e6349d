"""The verification-cost curve: forward time of n new tokens on top of a cached context.

The cost of a speculative step is (d·T_draft + T_verify(n)) / τ, so how T_verify grows with n
decides whether a tree pays on a given model, precision and device. One function measures it
for the report (the curve each run records per target: bench/probes.py) and the benchmarks; no decision
reads it (the planner prices drafts on decoding/sizing/planner.py's cost surface, measured on ragged batch passes).
"""

from __future__ import annotations

import statistics
import time

import torch

from specledger.engine.loader import LoadedModel

CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64)


def clock(device: torch.device) -> float:
    """The one clock for engine and decoding timings: perf_counter after the device's queued work is done
    (CUDA kernels run asynchronously; without the synchronisation a step would look almost free)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()
def forward_time_curve(
    lm: LoadedModel,
    *,
    context: int = 256,
    sizes: tuple[int, ...] = CURVE_SIZES,
    reps: int = 5,
) -> dict[int, float]:
    """Median seconds per forward (logits at every new position, as a verifier needs) for each n in sizes.

    One unmeasured round first; each round visits every size, so a burst of load from elsewhere
    hits one round rather than one size.
    """
    m = lm.model
    dev = m.device
    sizes = tuple(n for n in sizes if n < m.cfg.max_seq_len)
    context = max(1, min(context, m.cfg.max_seq_len - max(sizes)))
    gen = torch.Generator().manual_seed(0)
    cache = m.new_cache(context + max(sizes))
    xs = {n: torch.randint(0, m.cfg.vocab_size, (1, n), generator=gen).to(dev) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    m.hidden(torch.randint(0, m.cfg.vocab_size, (1, context), generator=gen).to(dev), cache)
    for rep in range(reps + 1):
        for n in sizes:
            cache.rollback(0, context)
            t0 = clock(dev)
            m.logits(m.hidden(xs[n], cache))
            t1 = clock(dev)
            if rep:
                times[n].append(t1 - t0)
    return {n: statistics.median(times[n]) for n in sizes}

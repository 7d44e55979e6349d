"""How far the CPU-time energy estimate is from the RAPL counters, on a host that has both (issue 46).

Where a machine has no power counter (most cloud VMs), specledger estimates a request's energy as the process's
busy CPU seconds times a power per busy logical CPU (bench/energy.py: `--cpu-watts`, else its table of known
CPUs). This script runs the same greedy requests under two meters at once, the counters (RAPL package and DRAM,
idle power subtracted) and the estimate, per configuration and round, alternating the configurations with an A/A
twin of the first, and prints for each: joules by counter, joules by estimate, estimate / counter (the estimate's
error: the goal asks it written in BENCHMARKS.md), and the watts per busy CPU the counters imply (what to pass as
`--cpu-watts` on this machine). Without readable counters it says so and exits 2: nothing is estimated against
nothing.
    python benchmarks/energy_estimate.py [--configs fp32,int4] [--rounds 3] [--new-tokens 64] [--threads 2]
        [--powercap-root /sys/class/powercap] [--cpu-watts W]
"""

from __future__ import annotations

import argparse
import sys
import time

import psutil
import torch

from common import long_prompts, machine, median, now
from specledger.bench.energy import EnergyMeter, tree_cpu_seconds
from specledger.decoding.factory import make_strategy
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.engine.loader import default_dtype, load_model

PRECISIONS = {"fp32": ("none", "fp32"), "bf16": ("none", "bf16"), "int8": ("int8", None),
              "int4": ("int4", None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="fp32,int4", help="precisions of the embedded model: fp32, bf16, int8, int4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=3, help="requests per configuration per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--powercap-root", default="/sys/class/powercap")
    ap.add_argument("--cpu-watts", type=float, default=None, help="the estimate's power per busy CPU (default: table)")
    a = ap.parse_args()
    counter = EnergyMeter(powercap_root=a.powercap_root, estimate=False, idle_probe_s=2.0)
    if not counter.available:
        print(f"no power counter is readable here (RAPL under {a.powercap_root}, NVML): the estimate has nothing to "
              "be measured against. Run this on a host with RAPL (bare metal or a VM that exposes powercap).",
              file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    names = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = [c for c in names if c not in PRECISIONS]
    if bad:
        print(f"unknown configuration {bad[0]!r} (known: {', '.join(PRECISIONS)})", file=sys.stderr)
        return 2
    contenders = names[:1] + [f"{names[0]} (A/A)"] + names[1:]
    strategies = {}
    for c in names:
        quant, dtype = PRECISIONS[c]
        lm = load_model("smollm2-135m", quant=quant, dtype=dtype or default_dtype(quant))
        strategies[c] = make_strategy("ar", lm)
    tok = next(iter(strategies.values())).target.tokenizer
    prompts = [tok.chat([{"role": "user", "content": p}]) for p in long_prompts(a.requests)]
    sp = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
    rows: dict[str, list[tuple[float, float, float]]] = {c: [] for c in contenders}  # (counter J, estimate J, CPU s)
    proc = psutil.Process()
    print(f"{machine()}; counters: {counter.source}; {now()}")
    for r in range(a.rounds):
        order = contenders if r % 2 == 0 else contenders[::-1]
        for c in order:
            strat = strategies[c.split(" ")[0]]
            est = EnergyMeter(powercap_root="/nonexistent", use_nvml=False, cpu_watts=a.cpu_watts)
            j0, e0, s0 = counter.read(), est.read(), tree_cpu_seconds(proc)
            for ids in prompts:
                generate(strat, ids, sp)
            j1, e1, s1 = counter.read(), est.read(), tree_cpu_seconds(proc)
            assert None not in (j0, j1, e0, e1)
            rows[c].append((j1 - j0, e1 - e0, s1 - s0))  # type: ignore[operator]
        time.sleep(0.5)
    print(f"estimate: {est.source}")
    print(f"{'configuration':<16} {'counter J':>10} {'estimate J':>11} {'est/counter':>12} {'W per busy CPU':>15}")
    for c in contenders:
        cj = median([x[0] for x in rows[c]])
        ej = median([x[1] for x in rows[c]])
        w = median([x[0] / x[2] for x in rows[c] if x[2] > 0])
        print(f"{c:<16} {cj:>10.1f} {ej:>11.1f} {ej / cj if cj > 0 else float('nan'):>12.2f} {w:>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

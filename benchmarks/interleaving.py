"""A/A: one configuration measured twice in one run, one after the other vs interleaved.

Two identical configurations (autoregressive, fp32, the embedded model) should come out at 1.00x. Run one
after the other, a change in machine load between them becomes a phantom speed-up; interleaved request
by request (seeded random block order, bench/runner.py) the drift hits both alike. With --hog, a
background process spins on one core for part of the run (starting --hog-delay seconds in, for
--hog-seconds), the case the issue measured. For each mode the script prints the tok/s ratio of the
twins, its paired 95% interval (same prompts under both, bootstrap), the ledger's verdicts for the pair
(indistinguishable expected) and the calibration probe's drift.

    python benchmarks/interleaving.py [--workload builtin] [--max-tokens 24] [--repeats 1]
                                      [--hog] [--hog-delay 20] [--hog-seconds 60]
                                      [--runs N] [--modes sequential,interleaved]
Goal (issue 12): interleaved ratio within 1.00 +- 0.05 with the hog; sequential typically is not. With
--runs N (each run its own seed) it also prints, per mode, the share of runs in which the twins were called
indistinguishable by the ledger in every scenario of the default cost file and neither was "cheapest" or
"dominated" (goal: >= 95%), and the share whose paired interval held 1.00.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOG = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


def start_hog(delay: float, seconds: float, procs: list) -> threading.Timer:
    """One spinning process on one core, from `delay` s on, for `seconds` s."""
    def go() -> None:
        procs.append(subprocess.Popen([sys.executable, "-c", HOG.format(s=seconds)]))

    timer = threading.Timer(delay, go)
    timer.start()
    return timer


def measure(interleave: bool, args, out: Path) -> dict:
    from specledger.records.config import parse_run_config
    from specledger.bench.runner import run_benchmark
    from specledger.ledger.measurements import measurements_from_run
    from specledger.ledger.paired import paired_speedup
    from specledger.ledger.price import price_run

    twin = {"strategy": "ar", "model": "smollm2-135m", "dtype": "fp32", "max_tokens": args.max_tokens}
    cfg = parse_run_config({
        "configs": [{"name": "ar-a", **twin}, {"name": "ar-b", **twin}],
        "workload": {"spec": args.workload}, "load": {"concurrency": [1], "warmup": 1},
        "interleave": interleave, "repeats": args.repeats, "seed": args.seed, "verify_curve": False,
        "gates": {"quantization": False}, "bootstrap": 200,
    })
    procs: list[subprocess.Popen] = []
    timer = start_hog(args.hog_delay, args.hog_seconds, procs) if args.hog else None
    t0 = time.perf_counter()
    try:
        run, run_dir = run_benchmark(cfg, run_dir=out / ("interleaved" if interleave else "sequential"),
                                     show_progress=False)
    finally:
        if timer is not None:
            timer.cancel()
        for p in procs:
            p.kill()
            p.wait()
    wall = time.perf_counter() - t0
    ms = {m.name: m for m in measurements_from_run(run_dir)}
    a, b = ({r.key: (r.service_s, r.output_tokens) for r in ms[n].requests if r.service_s} for n in ("ar-a", "ar-b"))
    pr = paired_speedup(a, b, resamples=2000, seed=args.seed)
    ledger = price_run(run_dir, None, samples=2000, seed=args.seed)
    verdicts = {r.name: r.verdict for r in ledger.configs}
    scenarios = [verdicts] + [{r["name"]: r["verdict"] for r in rows} for rows in ledger.scenarios.values()]
    told_apart = any(v["ar-a"] != "indistinguishable" or v["ar-b"] != "indistinguishable" for v in scenarios)
    return {"mode": "interleaved" if interleave else "sequential", "ratio": pr.ratio, "low": pr.low,
            "high": pr.high, "n": pr.n, "tok_s": (ms["ar-a"].tok_s, ms["ar-b"].tok_s), "verdicts": verdicts, "told_apart": told_apart,
            "drift": run.noise.drift if run.noise else None, "warning": run.noise.warning if run.noise else None,
            "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="builtin")
    ap.add_argument("--max-tokens", "--max-new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hog", action="store_true", help="a background process takes a core for part of each run")
    ap.add_argument("--hog-delay", type=float, default=20.0)
    ap.add_argument("--hog-seconds", type=float, default=60.0)
    ap.add_argument("--runs", type=int, default=1, help="repeat each mode, seeds seed..seed+runs-1")
    ap.add_argument("--modes", default="sequential,interleaved")
    args = ap.parse_args()

    from common import machine, now

    print(f"# A/A interleaving — {now()} — {machine()}")
    print(f"workload {args.workload}, {args.max_tokens} new tokens, repeats {args.repeats}, "
          f"hog {'on: +%gs for %gs' % (args.hog_delay, args.hog_seconds) if args.hog else 'off'}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    tally = {m: {"runs": 0, "indistinguishable": 0, "holds_1": 0} for m in modes}
    first_seed = args.seed
    for k in range(args.runs):
        args.seed = first_seed + k
        with tempfile.TemporaryDirectory() as tmp:
            for mode in modes:
                r = measure(mode == "interleaved", args, Path(tmp))
                ok = r["low"] is not None and r["low"] <= 1.0 <= r["high"]
                within = r["ratio"] is not None and abs(r["ratio"] - 1.0) <= 0.05
                drift = "–" if r["drift"] is None else f"{r['drift']:.0%}"
                t = tally[mode]
                t["runs"] += 1
                t["indistinguishable"] += not r["told_apart"]
                t["holds_1"] += ok
                print(f"{r['mode']:>11} seed {args.seed}: ar-a/ar-b {r['ratio']:.3f}x [{r['low']:.3f}–{r['high']:.3f}] "
                      f"over {r['n']} prompts (tok/s {r['tok_s'][0]:.1f} vs {r['tok_s'][1]:.1f}); interval holds 1: "
                      f"{ok}; within ±5%: {within}; verdicts {r['verdicts']}; probe drift {drift}; {r['wall_s']:.0f} s",
                      flush=True)
                if r["warning"]:
                    print(f"{'':>13}warning: {r['warning']}")
    if args.runs > 1:
        for mode, t in tally.items():
            print(f"{mode}: twins indistinguishable in every scenario (neither cheapest nor dominated) in "
                  f"{t['indistinguishable']}/{t['runs']} runs ({t['indistinguishable'] / t['runs']:.0%}); paired "
                  f"interval held 1.00 in {t['holds_1']}/{t['runs']}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()

"""The concurrency benchmark over HTTP: `specledger serve` (AR and each method, per precision) side by side with
llama.cpp's server on the same GGUF (`llama-server --parallel N`, its own speculation off and on), every one a
managed server driven through the harness's OpenAI backend (`specledger bench --backend openai`), in one run per
precision: all its servers up at once, concurrency 1 interleaved request by request in seeded random order, the
other levels configuration by configuration in seeded random order (the harness's interleaving). "ar-aa" is AR
again on a second server (the A/A pair: its ratio to "ar" is the noise floor), for specledger's servers and for
llama-server's.

Per configuration and concurrency: aggregate output tok/s, ITL p50/p95, TTFT p50, τ; each one's ratio to its own
family's AR (serve-<precision>-ar, llama-ar) and to llama-ar at the same concurrency. Every answer is exactly
--new-tokens long (max_tokens = min_tokens, ignore_eos) so every contender does the same work.

Used by benchmarks/concurrency.py --servers (see its docstring for the commands).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PRECISION_FLAGS = {"fp32": "--dtype fp32", "bf16": "--dtype bf16", "int4": "--quant int4"}
SERVE_METHODS = {"ar": "ar", "ar-aa": "ar", "lookup": "lookup", "draft": "draft", "eagle": "eagle"}
LLAMA_METHODS = {"ar": "", "ar-aa": "",
                 "ngram": " --spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 6"}


def serve_config(precision: str, method: str, *, max_c: int, threads: int, new_tokens: int, ctx: int) -> dict:
    strategy = SERVE_METHODS[method]
    extra = " --draft-quant int4" if strategy == "draft" else ""
    command = ("{python} -m specledger.cli serve --model {model} --host {host} --port {port} "
               f"{PRECISION_FLAGS[precision]} --strategy {strategy}{extra} --max-batch {max_c} "
               f"--max-queue {4 * max_c} --max-seq-len {ctx} --log-level warning")
    return {"name": f"serve-{precision}-{method}", "backend": "openai", "model": "smollm2-135m",
            "strategy": strategy, "max_tokens": new_tokens,
            "openai": {"server": {"command": command, "startup_timeout_s": 900,
                                  "env": {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}},
                       "extra_body": {"ignore_eos": True}, "timeout_s": 1200}}


def llama_config(method: str, *, max_c: int, threads: int, new_tokens: int, ctx: int) -> dict:
    command = ("{llama_server} -m {model_path} --host {host} --port {port} "
               f"-t {threads} --parallel {max_c} -c {ctx * max_c} --metrics --no-webui --seed 0" + LLAMA_METHODS[method])
    return {"name": f"llama-{method}", "backend": "openai", "model": "smollm2-135m",
            "strategy": "ngram-simple" if method == "ngram" else "ar", "max_tokens": new_tokens,
            "openai": {"server": {"command": command, "startup_timeout_s": 300},
                       "extra_body": {"ignore_eos": True}, "timeout_s": 1200, "transport_retries": 3}}


def workload(path: Path, prompts: list[str], new_tokens: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": p}],
                                        "max_tokens": new_tokens, "min_tokens": new_tokens}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def run_config(precision: str, methods: list[str], llama: list[str], levels: list[int], *, requests: int,
               new_tokens: int, threads: int, repeats: int, wl: Path, seed: int) -> dict:
    max_c, ctx = max(levels), 512 + new_tokens
    if precision == "int4" and "draft" in methods:  # its W4A16 drafter would be the target itself
        print("note: no draft configuration on int4 (the drafter is the target's own W4A16 copy)")
        methods = [m for m in methods if m != "draft"]
    configs = [serve_config(precision, m, max_c=max_c, threads=threads, new_tokens=new_tokens, ctx=ctx)
               for m in methods]
    configs += [llama_config(m, max_c=max_c, threads=threads, new_tokens=new_tokens, ctx=ctx) for m in llama]
    return {"configs": configs, "workload": {"spec": f"chat:{wl}"},
            "load": {"concurrency": levels, "num_requests": max(requests, max_c), "warmup": 1,
                     "warmup_max_tokens": 4},
            "interleave": True, "repeats": repeats, "seed": seed, "bootstrap": 0, "verify_curve": False}


def bench(cfg: dict, out_dir: Path, run_id: str) -> Path:
    """`specledger bench` on the configuration, in a subprocess (its servers are stopped on every way out)."""
    path = out_dir / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "specledger.cli", "bench", str(path), "--no-progress",
                        "--output-dir", str(out_dir), "--run-id", run_id], env=env, text=True)
    if p.returncode != 0:
        raise SystemExit(f"specledger bench failed (exit {p.returncode}); run directory {out_dir / run_id}")
    return out_dir / run_id


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    from specledger.records.results import load_run

    run = load_run(run_dir)
    out = []
    for c in run.configs:
        for lr in c.loads:
            a = lr.aggregate
            out.append({"config": c.name, "concurrency": lr.concurrency, "tok_s": a.output_tok_s,
                        "itl_p50_ms": None if a.itl.p50 is None else 1e3 * a.itl.p50,
                        "itl_p95_ms": None if a.itl.p95 is None else 1e3 * a.itl.p95,
                        "ttft_p50_ms": None if a.ttft.p50 is None else 1e3 * a.ttft.p50, "tau": a.tau,
                        "ok": a.requests_ok, "failed": a.requests_failed})
    return out


def family_base(name: str) -> str:
    """The AR configuration a configuration's speed-up is read against: its own server family's."""
    if name.startswith("llama-"):
        return "llama-ar"
    return name.rsplit("-", 1)[0] + "-ar" if not name.endswith("-ar-aa") else name[: -len("-aa")]


def with_ratios(rows: list[dict]) -> list[dict]:
    by = {(r["config"], r["concurrency"]): r for r in rows}
    for r in rows:
        base = by.get((family_base(r["config"]), r["concurrency"]))
        llama = by.get(("llama-ar", r["concurrency"]))
        r["x_ar"] = r["tok_s"] / base["tok_s"] if base and base["tok_s"] and r["tok_s"] else None
        r["x_llama"] = r["tok_s"] / llama["tok_s"] if llama and llama["tok_s"] and r["tok_s"] else None
        first = by.get((r["config"], min(x["concurrency"] for x in rows if x["config"] == r["config"])))
        r["x_c1"] = r["tok_s"] / first["tok_s"] if first and first["tok_s"] and r["tok_s"] else None
    return rows


def print_table(title: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    t = Table(title=title, title_justify="left")
    for col in ("c", "configuration", "tok/s", "x own AR", "x llama-ar", "x its c=1", "ITL p50 ms", "ITL p95 ms",
                "TTFT p50 ms", "tau", "failed"):
        t.add_column(col, justify="left" if col == "configuration" else "right")
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["config"])):
        t.add_row(str(r["concurrency"]), r["config"], f(r["tok_s"], ".1f"), f(r["x_ar"], ".2f"), f(r["x_llama"], ".2f"),
                  f(r["x_c1"], ".2f"), f(r["itl_p50_ms"], ".1f"), f(r["itl_p95_ms"], ".1f"), f(r["ttft_p50_ms"], ".0f"),
                  f(r["tau"], ".2f"), str(r["failed"]))
    Console(width=160).print(t)


def aa_floor(rows: list[dict]) -> dict[str, float]:
    """The A/A pairs' largest deviation from 1 over the concurrency levels, per family."""
    out = {}
    for r in rows:
        if r["config"].endswith("-ar-aa") and r["x_ar"]:
            key = r["config"][: -len("-ar-aa")]
            out[key] = max(out.get(key, 0.0), abs(r["x_ar"] - 1))
    return out


def summary(rows: list[dict]) -> str:
    floors = aa_floor(rows)
    parts = ["A/A noise floor (max |ratio - 1| over levels): " + (", ".join(f"{k} ±{v:.1%}" for k, v in floors.items())
                                                                   or "no A/A pair run")]
    serve_ar = [r for r in rows if r["config"].startswith("serve-") and r["config"].endswith("-ar")]
    for c in sorted({r["concurrency"] for r in serve_ar}):
        xs = [r["x_llama"] for r in serve_ar if r["concurrency"] == c and r["x_llama"]]
        if xs:
            parts.append(f"c={c}: specledger serve AR / llama-ar median {statistics.median(xs):.2f}")
    return "\n".join(parts)

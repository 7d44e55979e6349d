"""Speculative decoding side by side on the embedded model, per task kind and overall.

Every configuration runs the same prompts (the first turn of the built-in workload's
questions, N per task kind), greedy, alternating configuration by configuration for each
prompt. Speed-ups are against autoregressive decoding of the same target precision,
measured in the same run; nothing is multiplied across runs.

llama.cpp's plain decode of the same GGUF (when llama-cpp-python is installed) runs in the
same rotation, for as many tokens as the fp32 autoregressive answer to each prompt, so
that every configuration is also compared with it.

    python benchmarks/speculation.py [--per-kind 4] [--new-tokens 128] [--only eagle,hier] [--no-llamacpp]
                                     [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from common import LlamaCpp, llamacpp_available, machine, median, now  # noqa: E402

from specledger.records.question import KINDS  # noqa: E402
from specledger.bench.workload import load_workload  # noqa: E402
from specledger.decoding.factory import make_strategy  # noqa: E402
from specledger.decoding.loop.generate import generate  # noqa: E402
from specledger.decoding.sampling import SamplingParams  # noqa: E402
from specledger.engine.loader import load_model  # noqa: E402

console = Console(width=170)

TARGETS = {"fp32": ("none", "fp32"), "bf16": ("none", "bf16"), "w4a16": ("int4", "bf16"), "w8a16": ("int8", "bf16")}


def configs(models: dict) -> list[tuple[str, str, str, dict]]:
    """(name, target, strategy, params); the hierarchy's intermediate is chosen in docs/benchmarks-log.md."""
    return [
        ("ar fp32", "fp32", "ar", {}),
        ("ar bf16", "bf16", "ar", {}),
        ("ar w4a16", "w4a16", "ar", {}),
        ("lookup fp32", "fp32", "lookup", {}),
        ("lookup w4a16", "w4a16", "lookup", {}),
        ("draft(w4a16) fp32", "fp32", "draft", {"draft": models["w4a16"], "max_nodes": 4}),
        ("draft(w4a16) bf16", "bf16", "draft", {"draft": models["w4a16"], "max_nodes": 4}),
        ("eagle fp32", "fp32", "eagle", {}),
        ("eagle bf16", "bf16", "eagle", {}),
        ("eagle w4a16", "w4a16", "eagle", {}),
        ("hier eagle>w4a16>bf16", "bf16", "hier", {"intermediate": models["w4a16"]}),
        ("hier lookup>w4a16>bf16", "bf16", "hier", {"intermediate": models["w4a16"], "drafter": "lookup"}),
        ("hier eagle>bf16>w4a16", "w4a16", "hier", {"intermediate": models["bf16"]}),
        ("hier eagle>w8a16>w4a16", "w4a16", "hier", {"intermediate": models["w8a16"]}),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--only", default=None, help="comma-separated substrings of configuration names to keep (ar always kept)")
    ap.add_argument("--no-llamacpp", action="store_true", help="leave out llama.cpp's plain decode")
    ap.add_argument("--threads", type=int, default=None, help="torch (and llama.cpp) threads")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    console.print(f"[bold]speculation[/] {now()} — {machine()}")
    models = {k: load_model("smollm2-135m", quant=q, dtype=d) for k, (q, d) in TARGETS.items()}
    cfgs = configs(models)
    if a.only:
        keep = a.only.split(",")
        cfgs = [c for c in cfgs if c[2] == "ar" or any(k in c[0] for k in keep)]
    strategies = {}
    for name, tgt, strat, params in cfgs:
        try:
            strategies[name] = (tgt, make_strategy(strat, models[tgt], **params))
        except Exception as exc:  # a strategy that cannot be built here is reported, not fatal
            console.print(f"skipped {name}: {exc}")
    llama = LlamaCpp() if not a.no_llamacpp and llamacpp_available() else None
    LLAMA = "llama.cpp Q4_1 (ar)"
    qs = load_workload("builtin", per_category=None)
    by_kind: dict[str, list] = defaultdict(list)
    for q in qs:
        if len(by_kind[q.kind]) < a.per_kind:
            by_kind[q.kind].append(q)
    tok = models["fp32"].tokenizer
    prompts = [(k, tok.chat([{"role": "user", "content": q.turns[0]}])) for k in KINDS for q in by_kind[k]]
    console.print(f"{len(prompts)} prompts ({a.per_kind} per kind), {a.new_tokens} new tokens, greedy, {len(strategies)} configurations")
    sp = SamplingParams(max_tokens=a.new_tokens)
    rows: list[dict] = []
    names = list(strategies) + ([LLAMA] if llama else [])
    from rich.progress import Progress

    with Progress(console=console) as prog:
        task = prog.add_task("runs", total=len(prompts) * len(names))
        for i, (kind, ids) in enumerate(prompts):
            order = names[i % len(names):] + names[: i % len(names)]
            if llama:  # llama.cpp follows ar fp32, whose answer length it matches
                order = [n for n in order if n not in (LLAMA, "ar fp32")]
                order[i % (len(order) + 1):i % (len(order) + 1)] = ["ar fp32", LLAMA]
            for name in order:
                if name == LLAMA:
                    n_ar = next(x["tokens"] for x in rows if x["config"] == "ar fp32" and x["prompt"] == i)
                    o = llama.run(ids, n_ar)
                    rows.append({"config": name, "target": "llama.cpp", "kind": kind, "prompt": i, "tokens": o["tokens"],
                                 "steps": o["tokens"], "appended": o["tokens"], "ttft": o["ttft"], "prefill": o["ttft"],
                                 "draft_prefill": 0.0, "total": o["total"], "levels": [], "ids": o["ids"], "params": {}})
                    prog.advance(task)
                    continue
                tgt, s = strategies[name]
                r = generate(s, ids, sp)
                rows.append({"config": name, "target": tgt, "kind": kind, "prompt": i, "tokens": len(r.token_ids),
                             "steps": r.steps, "appended": r.appended, "ttft": r.ttft_s, "prefill": r.prefill_s,
                             "draft_prefill": r.draft_prefill_s, "total": r.total_s,
                             "levels": [lv.as_dict() for lv in r.levels], "ids": r.token_ids, "params": r.params})
                prog.advance(task)

    def agg(rs):
        tok_ = sum(x["tokens"] - 1 for x in rs)
        dec_t = sum(x["total"] - x["ttft"] for x in rs)
        lv = defaultdict(lambda: [0, 0])
        for x in rs:
            for lvl in x["levels"]:
                lv[lvl["name"]][0] += lvl["proposed"]
                lv[lvl["name"]][1] += lvl["accepted"]
        return {"decode_tok_s": tok_ / dec_t if dec_t else 0, "e2e_tok_s": sum(x["tokens"] for x in rs) / sum(x["total"] for x in rs),
                "tau": sum(x["appended"] for x in rs) / max(1, sum(x["steps"] for x in rs)),
                "ttft_ms": median([x["ttft"] * 1000 for x in rs]), "draft_prefill_ms": median([x["draft_prefill"] * 1000 for x in rs]),
                "levels": {k: (v[0], v[1], v[1] / v[0] if v[0] else None) for k, v in lv.items()}}

    overall = {n: agg([x for x in rows if x["config"] == n]) for n in names}
    per_kind = {n: {k: agg([x for x in rows if x["config"] == n and x["kind"] == k]) for k in KINDS if by_kind[k]} for n in names}
    ar_of = {tgt: f"ar {tgt}" for tgt in TARGETS} | {"llama.cpp": LLAMA}
    target_of = {n: strategies[n][0] if n in strategies else "llama.cpp" for n in names}
    t = Table(title=f"overall ({len(prompts)} prompts, {a.new_tokens} new tokens, greedy)")
    for col in ("config", "tau", "acceptance per level (proposed→accepted)", "decode tok/s", "e2e tok/s", "TTFT ms", "draft prefill ms", "decode speed-up", "e2e speed-up", "decode vs llama.cpp", "identical to ar"):
        t.add_column(col, justify="right")
    for n in names:
        s, tgt = overall[n], target_of[n]
        base = overall.get(ar_of[tgt])
        ll = overall.get(LLAMA)
        ref_rows = {x["prompt"]: x["ids"] for x in rows if x["config"] == ar_of[tgt]}
        same = [x["ids"] == ref_rows.get(x["prompt"]) for x in rows if x["config"] == n]
        div = [next((j for j, (u, v) in enumerate(zip(x["ids"], ref_rows[x["prompt"]])) if u != v), None)
               for x in rows if x["config"] == n and x["ids"] != ref_rows.get(x["prompt"])]
        div = [d for d in div if d is not None]
        lv = "; ".join(f"{k}: {p}→{acc} ({r:.0%})" for k, (p, acc, r) in s["levels"].items() if r is not None)
        t.add_row(n, f"{s['tau']:.2f}", lv or "-", f"{s['decode_tok_s']:.1f}", f"{s['e2e_tok_s']:.1f}", f"{s['ttft_ms']:.0f}",
                  f"{s['draft_prefill_ms']:.0f}", f"{s['decode_tok_s'] / base['decode_tok_s']:.2f}x" if base else "-",
                  f"{s['e2e_tok_s'] / base['e2e_tok_s']:.2f}x" if base else "-",
                  f"{s['decode_tok_s'] / ll['decode_tok_s']:.2f}x" if ll else "-", f"{sum(same)}/{len(same)}" + (f" (first divergence at token {min(div)}-{max(div)})" if div else ""))
    console.print(t)
    t = Table(title="per task kind: tau / decode speed-up over ar of the same target")
    t.add_column("config")
    kinds = [k for k in KINDS if by_kind[k]]
    for k in kinds:
        t.add_column(k, justify="right")
    for n in names:
        base = per_kind.get(ar_of[target_of[n]])
        cells = []
        for k in kinds:
            s = per_kind[n][k]
            sp_ = s["decode_tok_s"] / base[k]["decode_tok_s"] if base else float("nan")
            cells.append(f"{s['tau']:.2f} / {sp_:.2f}x")
        t.add_row(n, *cells)
    console.print(t)
    for n in names:
        p = next(x["params"] for x in rows if x["config"] == n)
        if p:
            console.print(f"{n}: {p}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": now(), "machine": machine(), "overall": overall, "per_kind": per_kind,
                       "rows": [{k: v for k, v in x.items() if k != "ids"} for x in rows]}, f, indent=2, default=str)


if __name__ == "__main__":
    main()

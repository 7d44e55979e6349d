"""Results other tools measured, turned into a run directory the ledger and the report read.

`vllm bench serve --save-result` writes one JSON object per run: the traffic settings (request_rate,
max_concurrency, num_prompts), totals (duration, completed, failed, total_input_tokens,
total_output_tokens, request_throughput, output_throughput) and, per latency metric named in
--percentile-metrics (ttft, tpot, itl, e2el), mean_/median_/std_<m>_ms plus p<P>_<m>_ms for each
--metric-percentiles value (99 only, by default). With --save-detailed it also keeps per-request
lists: input_lens, output_lens, ttfts (s), itls (s, one list per request), generated_texts, errors.

What an import lacks is said in the run's notes: the prompts (so no grading: the pass rate must come
from a gate run elsewhere), send times (queueing is invisible; TTFT counts from the send), and
speculation statistics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import specledger
from specledger.bench.metrics import aggregate
from specledger.records.results import (
    Aggregate, Conditions, ConfigResult, Dist, LoadResult, RequestLog, RequestRecord, RunResult, REQUESTS_FILE,
    RUN_FILE, now, write_run, write_summary,
)
from specledger.errors import BadInput

_METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}


def read_json(path: Path, what: str) -> dict[str, Any]:
    """One JSON object from a peer tool's result file, or a one-line error saying what was expected."""
    if not path.is_file():
        raise BadInput(f"{path}: {'a directory, not a file' if path.is_dir() else 'no such file'}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not JSON ({exc}); expected {what}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected {what}")
    return data


def _summary_dist(data: dict[str, Any], metric: str, n: int) -> Dist:
    """A latency distribution from vLLM's mean_/median_/pXX_<metric>_ms fields, in seconds."""
    def ms(key: str) -> float | None:
        v = data.get(key)
        return float(v) / 1000.0 if isinstance(v, (int, float)) and math.isfinite(v) else None

    return Dist(n=n if ms(f"mean_{metric}_ms") is not None else 0, mean=ms(f"mean_{metric}_ms"),
                p50=ms(f"median_{metric}_ms") if ms(f"median_{metric}_ms") is not None else ms(f"p50_{metric}_ms"),
                p90=ms(f"p90_{metric}_ms"), p95=ms(f"p95_{metric}_ms"), p99=ms(f"p99_{metric}_ms"))


def _load(data: dict[str, Any]) -> tuple[str, int | None, float | None]:
    conc = data.get("max_concurrency")
    rate = data.get("request_rate")
    if isinstance(conc, int) and conc > 0:
        return f"c={conc}", conc, None
    if isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0:
        return f"r={rate:g}", None, float(rate)
    n = int(data.get("num_prompts") or data.get("completed") or 1)  # every prompt sent at once
    return f"c={n}", n, None


def _records(data: dict[str, Any], name: str, run_id: str, label: str, conc: int | None,
             rate: float | None) -> list[RequestRecord]:
    """Per-request records from a --save-detailed file (end = TTFT + the sum of its inter-token gaps)."""
    ttfts, itls, outs = data["ttfts"], data.get("itls") or [], data.get("output_lens") or []
    ins, texts, errors = data.get("input_lens") or [], data.get("generated_texts") or [], data.get("errors") or []
    recs = []
    for i, ttft in enumerate(ttfts):
        err = errors[i] if i < len(errors) else ""
        gaps = [float(g) for g in (itls[i] if i < len(itls) else [])]
        out = int(outs[i]) if i < len(outs) else 0
        ok = not err and isinstance(ttft, (int, float)) and ttft > 0
        recs.append(record(name, run_id, label, conc, rate, i, t0=0.0, start=0.0,
                           end=float(ttft) + sum(gaps) if ok else 0.0, ttft=float(ttft) if ok else None, ok=ok,
                           error=str(err) if err else None, prompt=int(ins[i]) if i < len(ins) else None, out=out,
                           usage_out=out, itl=gaps, text=str(texts[i]) if i < len(texts) and texts[i] else ""))
    return recs


def import_vllm_bench(path: str | Path, run_dir: str | Path, *, name: str | None = None) -> RunResult:
    """A `vllm bench serve --save-result` JSON file -> a run directory (run.json, summary.csv, requests.jsonl
    when the file was saved with --save-detailed)."""
    path, run_dir = Path(path), Path(run_dir)
    data = read_json(path, "one JSON object (a `vllm bench serve --save-result` file)")
    missing = [k for k in ("duration", "completed", "total_output_tokens") if k not in data]
    if missing:
        raise BadInput(f"{path}: not a `vllm bench serve --save-result` file (missing {', '.join(missing)})")
    fresh(run_dir)
    model = str(data.get("model_id") or "unknown")
    name = name or f"{data.get('label') or data.get('backend') or data.get('endpoint_type') or 'vllm'}-" \
                   f"{model.rstrip('/').split('/')[-1]}"
    label, conc, rate = _load(data)
    completed, failed = int(data["completed"]), int(data.get("failed") or 0)
    duration = float(data["duration"])
    notes = [NOT_GRADED, "TTFT counts from the send: vLLM's client records no arrival times, so queueing is not visible",
             NO_SPECULATION]
    detailed = isinstance(data.get("ttfts"), list) and len(data["ttfts"]) > 0
    records: list[RequestRecord] = []
    if detailed:
        records = _records(data, name, run_dir.name, label, conc, rate)
        agg = aggregate(records, wall_s=duration, resamples=200)
        notes.append("per request: end-to-end = TTFT + the sum of its inter-token gaps (vLLM saves no end times)")
    else:
        dists: dict[str, Any] = {ours: _summary_dist(data, theirs, completed) for theirs, ours in _METRICS.items()}
        agg = Aggregate(
            requests_ok=completed, requests_failed=failed, prompt_tokens=int(data.get("total_input_tokens") or 0),
            output_tokens=int(data["total_output_tokens"]), wall_s=duration,
            output_tok_s=data.get("output_throughput"), requests_s=data.get("request_throughput"),
            **dists,
        )
        notes.append("summary only (saved without --save-detailed): no per-request latencies, so no bootstrap "
                     "intervals; percentiles are those vLLM was asked for")
        if agg.ttft.p95 is None or agg.e2e.p95 is None:
            notes.append("no p95 latencies (the ledger's objectives use p95; it takes a measured p99 as an upper "
                         "bound): rerun with --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99, "
                         "or --save-detailed")
    spec = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
    loads = [LoadResult(load=label, concurrency=conc, rate=rate, aggregate=agg, complete=True)]
    describe = f"vllm bench serve ({data.get('endpoint_type') or data.get('backend')}) model {model}, dated {data.get('date')}"
    return write_imported(run_dir, path, "vllm bench serve", name, model, loads, records, notes, describe, spec,
                          backend="vllm-bench-serve")


# ---- shared by every importer (peer_imports.py too) ----------------------------------------------------

NOT_GRADED = "no prompts or reference answers: not graded (take the pass rate from a quality gate run)"
NO_SPECULATION = "no speculation statistics (tau, acceptance): read the server's /metrics during the run for those"


def fresh(run_dir: Path) -> None:
    if (run_dir / REQUESTS_FILE).exists() or (run_dir / RUN_FILE).exists():
        raise BadInput(f"{run_dir} already holds a run; choose another directory")


def record(name: str, run_id: str, label: str, conc: int | None, rate: float | None, i: int, *, t0: float,
           start: float, end: float, ttft: float | None, ok: bool, error: str | None, prompt: int | None,
           out: int, usage_out: int | None, itl: list[float], text: str = "") -> RequestRecord:
    """One imported request (a single turn). Times are absolute seconds; t0 is the level's first send."""
    e2e = end - start if ok else None
    return RequestRecord(
        run_id=run_id, config=name, request_id=f"{name}|{label}|{i}|t1", item=i, question_id=str(i),
        category="imported", kind="imported", turn=1, turns=1, load=label, concurrency=conc, rate=rate,
        status="ok" if ok else "failed", error=error, prompt_tokens=prompt, output_tokens=out if ok else 0,
        usage_output_tokens=usage_out if ok else None, arrival_t=start - t0, start_t=start - t0,
        first_token_t=start - t0 + ttft if ok and ttft is not None else None, end_t=end - t0,
        ttft_s=ttft if ok else None, e2e_s=e2e,
        tpot_s=(e2e - ttft) / (out - 1) if ok and e2e is not None and ttft is not None and out > 1 else None,
        itl_s=itl if ok else [], output_text=text)


def write_imported(run_dir: Path, path: Path, tool: str, name: str, model: str, loads: list[LoadResult],
                   records: list[RequestRecord], notes: list[str], describe: str, spec: dict[str, Any], *,
                   backend: str | None = None) -> RunResult:
    """An import as a run directory the ledger and report read: one configuration as served, not graded here
    (requests.jsonl only when per-request)."""
    cr = ConfigResult(name=name, backend=backend or tool, model=model, strategy="as served", spec=spec, loads=loads,
                      comparable_reason="imported: quality not graded here")
    run = RunResult(run_id=run_dir.name, created=now(), status="complete",
                    conditions=Conditions(python="unknown", specledger=specledger.__version__,
                                          platform="unknown (imported)", backends={name: describe},
                                          config={"imported_from": str(path), "tool": tool, **spec}),
                    configs=[cr], notes=[f"imported from {tool}: {path}", *notes])
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--run-dir {run_dir}: cannot create it ({exc.strerror or exc})") from None
    if records:
        with RequestLog(run_dir) as log:
            for r in records:
                log.append(r)
    write_run(run_dir, run)
    write_summary(run_dir, run)
    return run

"""GuideLLM and AIPerf results turned into a run directory, per request, like the vLLM importer.

GuideLLM (`guidellm run --output kind=json,path=F`, 0.8.x): a report with `benchmarks`, one per load level
(strategy `synchronous`, `concurrent` with `streams`, `constant`/`poisson` with `rate`, ...), each holding its
requests under `requests.successful / errored / incomplete` with wall-clock `request_start_time` and
`request_end_time` (s), `time_to_first_token_ms`, `request_latency` (s), `prompt_tokens`, `output_tokens` and the
generated `output` text. It keeps no per-token times: ITL distributions are missing (TPOT is per request).

AIPerf (`aiperf profile --artifact-dir D`, 0.13.x): D/profile_export.jsonl, one record per request with
`metadata` (request_start_ns, request_end_ns, benchmark_phase, was_cancelled) and `metrics`, each `{value, unit}`:
time_to_first_token and request_latency (ms), inter_chunk_latency (ms, a list), output_sequence_length
(client tokenizer) and usage_completion_tokens / usage_prompt_tokens (server). The records do not say the
concurrency or rate of the run: the load is labelled by the peak number of requests seen in flight at once.

Neither keeps prompts or references (no grading here) nor speculation statistics; both time TTFT from the send,
so queueing before the send is not in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specledger.bench.formats.lines import Unreadable, jsonl_records
from specledger.bench.importers import NO_SPECULATION, NOT_GRADED, fresh, read_json, record, write_imported
from specledger.bench.metrics import aggregate
from specledger.records.results import LoadResult, RequestRecord, RunResult
from specledger.errors import BadInput

_COMMON = [NOT_GRADED, "TTFT counts from the send: queueing before the send is not visible", NO_SPECULATION]


# ---- GuideLLM ----------------------------------------------------------------------------------------------


def _guidellm_load(strategy: dict[str, Any]) -> tuple[str, int | None, float | None]:
    kind = strategy.get("type_") or strategy.get("kind") or ""
    if kind == "synchronous":
        return "c=1", 1, None
    if kind == "concurrent" and isinstance(strategy.get("streams"), int):
        return f"c={strategy['streams']}", strategy["streams"], None
    rate = strategy.get("rate")
    if isinstance(rate, (int, float)) and rate > 0:
        return f"r={rate:g}", None, float(rate)
    return f"{kind or 'unknown'}", None, None


def import_guidellm(path: str | Path, run_dir: str | Path, *, name: str | None = None) -> RunResult:
    """A GuideLLM JSON report -> a run directory with one load level per benchmark."""
    path, run_dir = Path(path), Path(run_dir)
    data = read_json(path, "a GuideLLM report (guidellm run --output kind=json,path=...)")
    benches = data.get("benchmarks")
    if not isinstance(benches, list) or not benches or not isinstance(benches[0].get("requests"), dict):
        raise BadInput(f"{path}: not a GuideLLM report (no `benchmarks` with `requests`)")
    fresh(run_dir)
    backend = (benches[0].get("config") or {}).get("backend") or {}
    model = str(backend.get("model") or "unknown")
    name = name or f"guidellm-{model.rstrip('/').split('/')[-1]}"
    loads: list[LoadResult] = []
    records: list[RequestRecord] = []
    for b in benches:
        label, conc, rate = _guidellm_load((b.get("config") or {}).get("strategy") or {})
        reqs = b["requests"]
        rows = [(r, True) for r in reqs.get("successful") or []]
        rows += [(r, False) for key in ("errored", "incomplete") for r in reqs.get(key) or []]
        if not rows:
            continue
        t0 = min(float(r["request_start_time"]) for r, _ in rows if r.get("request_start_time") is not None)
        level: list[RequestRecord] = []
        for r, ok in sorted(rows, key=lambda x: float(x[0].get("request_start_time") or t0)):
            start = float(r.get("request_start_time") or t0)
            end = float(r.get("request_end_time") or start)
            ttft_ms = r.get("time_to_first_token_ms")
            err = ((r.get("info") or {}).get("error") or ("incomplete" if not ok else None))
            out = int(r.get("output_tokens") or 0)
            level.append(record(name, run_dir.name, label, conc, rate, len(level), t0=t0, start=start, end=end,
                                 ttft=float(ttft_ms) / 1000 if ttft_ms is not None else None, ok=ok,
                                 error=str(err) if err else None, prompt=r.get("prompt_tokens"), out=out,
                                 usage_out=out, itl=[], text=str(r.get("output") or "")))
        wall = float(b.get("duration") or max(x.end_t for x in level))
        loads.append(LoadResult(load=label, concurrency=conc, rate=rate, complete=True,
                                aggregate=aggregate(level, wall_s=wall, resamples=200)))
        records += level
    notes = [*_COMMON, "no per-token times: ITL distributions are empty (TPOT per request is kept)"]
    version = (data.get("metadata") or {}).get("guidellm_version")  # (a report may write "metadata": null)
    return write_imported(run_dir, path, "guidellm", name, model, loads, records, notes,
                          f"guidellm {version or '?'} ({backend.get('kind')}) {backend.get('target')} model {model}",
                          {"guidellm_version": version})


# ---- AIPerf ------------------------------------------------------------------------------------------------


def _value(metrics: dict[str, Any], key: str) -> Any:
    m = metrics.get(key)
    return m.get("value") if isinstance(m, dict) else None


def _ms(metrics: dict[str, Any], key: str) -> float | None:
    m = metrics.get(key)
    if not isinstance(m, dict) or not isinstance(m.get("value"), (int, float)):
        return None
    scale = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "us": 1e-6, "ns": 1e-9}.get(str(m.get("unit", "ms")), 1e-3)
    return float(m["value"]) * scale


def _peak_in_flight(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def import_aiperf(path: str | Path, run_dir: str | Path, *, name: str | None = None,
                  model: str | None = None) -> RunResult:
    """AIPerf's per-request export (profile_export.jsonl, or the artifact directory holding it) -> a run
    directory. Warm-up records are left out."""
    path, run_dir = Path(path), Path(run_dir)
    if path.is_dir():
        path = path / "profile_export.jsonl"
    if not path.is_file():
        raise BadInput(f"{path}: no such file (give AIPerf's profile_export.jsonl or its artifact directory)")
    rows = []
    for n, r in jsonl_records(path):
        if isinstance(r, Unreadable):
            raise BadInput(f"{path}:{n}: not JSON (expected AIPerf's profile_export.jsonl, one record a line)")
        meta = r.get("metadata") if isinstance(r, dict) else None
        if not isinstance(meta, dict) or "request_start_ns" not in meta:
            raise BadInput(f"{path}:{n}: not an AIPerf record (no metadata.request_start_ns)")
        if meta.get("benchmark_phase", "profiling") == "profiling":
            rows.append(r)
    if not rows:
        raise BadInput(f"{path}: no profiling records")
    fresh(run_dir)
    model = model or "unknown"
    name = name or f"aiperf-{model.rstrip('/').split('/')[-1]}"
    spans = [(m["metadata"]["request_start_ns"] / 1e9, (m["metadata"].get("request_end_ns")
              or m["metadata"]["request_start_ns"]) / 1e9) for m in rows]
    conc = _peak_in_flight(spans)
    label = f"c={conc}"
    t0 = min(s for s, _ in spans)
    records: list[RequestRecord] = []
    for r, (start, end) in sorted(zip(rows, spans), key=lambda x: x[1][0]):
        m, meta = r.get("metrics") or {}, r["metadata"]
        err = r.get("error")
        ok = not err and not meta.get("was_cancelled") and _ms(m, "request_latency") is not None
        out = _value(m, "output_sequence_length")
        usage = _value(m, "usage_completion_tokens")
        out = int(out if out is not None else usage or 0)
        gaps = _value(m, "inter_chunk_latency")
        itl = [float(g) / 1000 for g in gaps] if isinstance(gaps, list) and len(gaps) == out - 1 else []
        latency = _ms(m, "request_latency")
        records.append(record(name, run_dir.name, label, conc, None, len(records), t0=t0, start=start,
                               end=start + latency if latency is not None else end, ttft=_ms(m, "time_to_first_token"),
                               ok=ok, error=(json.dumps(err) if not isinstance(err, str) else err) if err else None,
                               prompt=_value(m, "usage_prompt_tokens") or _value(m, "input_sequence_length"),
                               out=out, usage_out=int(usage) if usage is not None else None, itl=itl))
    wall = max(r.end_t for r in records)
    loads = [LoadResult(load=label, concurrency=conc, rate=None, complete=True,
                        aggregate=aggregate(records, wall_s=wall, resamples=200))]
    notes = [*_COMMON, f"the export does not record the run's concurrency or rate: labelled c={conc}, the peak "
             "number of requests in flight", "no generated text (AIPerf's export keeps none by default)",
             "ITL from AIPerf's inter-chunk gaps where a request has one token per chunk"]
    return write_imported(run_dir, path, "aiperf", name, model, loads, records, notes,
                          f"aiperf profile export, model {model}", {})

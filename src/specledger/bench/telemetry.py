"""What servers and the process report about themselves, normalised to per-level counts.

Sources: Prometheus counters scraped before and after a load level — vLLM v1's
`vllm:spec_decode_num_*` (labelled per engine / data-parallel rank: summed), llama.cpp server's
`llamacpp:spec_decode_*` (same schema), the project's server (`specledger:` prefix, a `level` label),
each with `num_accepted_tokens_per_pos{position}` — and SGLang's `sglang:spec_accept_length` /
`spec_accept_rate` gauges, which are instantaneous and so reported as read, never differenced; then
llama.cpp server's per-response `timings`, the `specledger` extension field of a response, and this
process's peak memory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specledger.spec_stats import LevelStats

_SPEC = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
_PER_POS = "num_accepted_tokens_per_pos"
_PREFIXES = {"vllm:spec_decode_": "vllm", "llamacpp:spec_decode_": "llamacpp", "specledger:spec_decode_": "server"}
_GAUGES = {"sglang:spec_accept_length": "sglang", "sglang:spec_accept_rate": "sglang"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_prometheus(text: str) -> Samples:
    """Samples as {(name, sorted labels): value}; names keep their `_total` suffix."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


REPLICA_LABEL = "replica"
CLIENT_REQUESTS = "specledger_client:replica_requests_total"


def merge_replica_metrics(texts: dict[str, str], client_requests: dict[str, int] | None = None) -> str:
    """Several replicas' /metrics as one exposition, every sample labelled `replica="<its URL>"`, so that
    counters sum over replicas (spec_counters, server_counters sum over other labels) and per-replica deltas
    stay readable (replica_counters). Untyped on output: the sample names are kept as read (`…_total`)."""
    lines: list[str] = []
    for replica, text in texts.items():
        for (name, labels), value in parse_prometheus(text).items():
            lines.append(_sample(name, {**dict(labels), REPLICA_LABEL: replica}, value))
    for replica, n in (client_requests or {}).items():
        lines.append(_sample(CLIENT_REQUESTS, {REPLICA_LABEL: replica}, n))
    return "\n".join(lines) + "\n"


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{k}="{esc(str(v))}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}} {value!r}"


def replica_counters(samples: Samples) -> dict[str, dict[str, float]]:
    """Per replica (the `replica` label merge_replica_metrics adds): the server_counters totals and the
    client's requests sent there."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in samples.items():
        lab = dict(labels)
        if REPLICA_LABEL not in lab:
            continue
        one = server_counters({(name, labels): value}) if name != CLIENT_REQUESTS else {name: value}
        for k, v in one.items():
            d = out.setdefault(lab[REPLICA_LABEL], {})
            d[k] = d.get(k, 0.0) + v
    return out


def _zero() -> dict[str, Any]:
    return {**{k: 0.0 for k in _SPEC}, "per_pos": {}}


def spec_counters(samples: Samples) -> dict[str, dict[str, Any]]:
    """{level: {num_drafts, num_draft_tokens, num_accepted_tokens, per_pos: {position: accepted}}}, each summed
    over every other label (engines, data-parallel ranks, model names)."""
    out: dict[str, dict[str, Any]] = defaultdict(_zero)
    for (name, labels), value in samples.items():
        for prefix, source in _PREFIXES.items():
            if not name.startswith(prefix):
                continue
            key = name[len(prefix):].removesuffix("_total")
            lab = dict(labels)
            level = lab.get("level") or source
            if key in _SPEC:
                out[level][key] += value
            elif key == _PER_POS and "position" in lab:
                pos = int(lab["position"])
                out[level]["per_pos"][pos] = out[level]["per_pos"].get(pos, 0.0) + value
    return dict(out)


def spec_gauges(samples: Samples) -> dict[str, dict[str, Any]]:
    """Instantaneous speculation gauges (SGLang): every labelled value as read, and their mean."""
    out: dict[str, dict[str, Any]] = {}
    for (name, labels), value in sorted(samples.items()):
        if name in _GAUGES:
            g = out.setdefault(_GAUGES[name], {"instantaneous": True})
            key = name.split(":", 1)[1]
            g.setdefault(key, {"values": []})["values"].append({"labels": dict(labels), "value": value})
    for g in out.values():
        for v in g.values():
            if isinstance(v, dict):
                v["mean"] = sum(x["value"] for x in v["values"]) / len(v["values"])
    return out


def server_counters(samples: Samples) -> dict[str, float]:
    """A few generic totals worth a before/after delta (request and token counts, server memory)."""
    wanted = {
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
        "specledger:prompt_tokens_total", "specledger:generation_tokens_total",
        "specledger:requests_total", "specledger:request_success_total", "process_resident_memory_bytes",
        "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total",
    }
    out: dict[str, float] = defaultdict(float)
    for (name, _labels), value in samples.items():
        if name in wanted:
            out[name] += value
    return dict(out)


def telemetry_delta(before: str | None, after: str | None) -> tuple[dict[str, Any] | None, list[LevelStats]]:
    """Compare two /metrics scrapes: raw deltas plus speculation counters as per-level (and per-position)
    acceptance. Gauges are reported as read after the window (flagged instantaneous)."""
    if before is None or after is None:
        return None, []
    b, a = parse_prometheus(before), parse_prometheus(after)
    sb, sa = spec_counters(b), spec_counters(a)
    levels: list[LevelStats] = []
    spec: dict[str, dict[str, Any]] = {}
    for level, counts in sa.items():
        prev = sb.get(level, _zero())
        d: dict[str, Any] = {k: counts[k] - prev[k] for k in _SPEC}
        d["per_pos"] = {p: v - prev["per_pos"].get(p, 0.0) for p, v in counts["per_pos"].items()}
        spec[level] = {k: d[k] for k in _SPEC}
        if d["per_pos"]:
            spec[level]["accepted_per_pos"] = [d["per_pos"][p] for p in sorted(d["per_pos"])]
        if d["num_draft_tokens"] > 0 or d["num_drafts"] > 0:
            per_pos = [int(d["per_pos"].get(i, 0)) for i in range(max(d["per_pos"], default=-1) + 1)]
            levels.append(LevelStats(name=level, proposed=int(d["num_draft_tokens"]), accepted=int(d["num_accepted_tokens"]),
                                     drafts=int(d["num_drafts"]), accepted_per_position=per_pos))
    cb, ca = server_counters(b), server_counters(a)
    deltas = {k: ca[k] - cb.get(k, 0.0) for k in ca if k != "process_resident_memory_bytes"}
    info: dict[str, Any] = {"spec_decode": spec, "counters": deltas}
    if "process_resident_memory_bytes" in ca:
        info["server_rss_bytes"] = ca["process_resident_memory_bytes"]
    for level, d in spec.items():
        if d["num_drafts"] > 0:  # each draft step appends its accepted tokens plus one bonus token
            info.setdefault("tau", {})[level] = 1.0 + d["num_accepted_tokens"] / d["num_drafts"]
    rb, ra = replica_counters(b), replica_counters(a)
    if ra:  # several replicas: each one's share of the window
        info["replicas"] = {r: {k: v - rb.get(r, {}).get(k, 0.0) for k, v in c.items()
                                if k != "process_resident_memory_bytes"} for r, c in ra.items()}
    gauges = spec_gauges(a)
    if gauges:
        info["gauges"] = gauges
    return info, levels


def response_levels(body: dict[str, Any]) -> tuple[list[LevelStats], int | None, float | None, dict[str, Any]]:
    """Per-request speculation statistics carried in a response body or final chunk.

    Returns (levels, steps, tau, raw) from the `specledger` extension, vLLM's `metrics.speculative_decoding`
    (served with `--per-request-spec-decode-metrics`) or llama.cpp `timings`.
    """
    ext = body.get("specledger")
    if isinstance(ext, dict):
        levels = [LevelStats.model_validate({"name": f"level{i}", **lv}) for i, lv in enumerate(ext.get("levels") or [])
                  if isinstance(lv, dict)]
        return levels, ext.get("steps"), ext.get("tau"), {"specledger": ext}
    metrics = body.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(spec, dict):
        return _vllm_request(spec)
    timings = body.get("timings")
    if isinstance(timings, dict):
        raw = {"timings": timings}
        accepted = int(timings.get("draft_n_accepted", 0))
        steps, tau = None, None
        if isinstance(timings.get("predicted_n"), int) and timings["predicted_n"] > 1:
            # The first token comes from the prompt pass; every later step appends its accepted drafts + 1.
            steps = max(1, timings["predicted_n"] - 1 - accepted)
            tau = (timings["predicted_n"] - 1) / steps
        levels = [LevelStats(name="draft", proposed=int(timings["draft_n"]), accepted=accepted, steps=steps)
                  ] if "draft_n" in timings else []
        return levels, steps, tau, raw
    return [], None, None, {}


def _vllm_request(spec: dict[str, Any]) -> tuple[list[LevelStats], int | None, float | None, dict[str, Any]]:
    """vLLM's per-request summary. `acceptance_histogram[j]` counts the verification steps that accepted exactly
    j drafts, so the tokens accepted at draft position i (0-based) are the steps that accepted more than i (kept in
    the level, and in `raw` as received).
    `num_spec_steps` counts steps that carried a draft: τ over them is 1 + accepted / steps (vLLM's
    `mean_acceptance_length`); steps without a draft (none proposed) are not in it."""
    hist = [int(x) for x in spec.get("acceptance_histogram") or []]
    steps = spec.get("num_spec_steps")
    steps = int(steps) if isinstance(steps, (int, float)) else (sum(hist) if hist else None)
    accepted = spec.get("num_accepted_draft_tokens")
    accepted = int(accepted) if isinstance(accepted, (int, float)) else sum(j * n for j, n in enumerate(hist))
    proposed = int(spec.get("num_draft_tokens") or 0)
    raw: dict[str, Any] = {"vllm_speculative_decoding": spec}
    per_pos = [sum(hist[i + 1:]) for i in range(len(hist) - 1)]
    if hist:
        raw["accepted_per_position"] = per_pos
    tau = 1 + accepted / steps if steps else None
    level = LevelStats(name="draft", proposed=proposed, accepted=accepted, steps=steps, drafts=steps,
                       accepted_per_position=per_pos)
    return [level], steps, tau, raw


# ---- this process's memory ------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of resident memory (Linux); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """Peak resident memory since the last reset (VmHWM), else since the process started."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        return None

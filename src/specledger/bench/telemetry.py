"""What servers and the process report about themselves, normalised to per-level counts.

Sources: Prometheus counters scraped before and after a load level (vLLM's
`vllm:spec_decode_num_*`; the project's server uses the same names with a `specledger:` prefix
and a `level` label), llama.cpp server's per-response `timings`, the `specledger` extension field
of a response, and this process's peak memory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specledger.bench.results import Acceptance, LevelCounts

_SPEC = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
_PREFIXES = ("vllm:spec_decode_", "specledger:spec_decode_")


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples as {(name, sorted labels): value}; names keep their `_total` suffix."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def spec_counters(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, dict[str, float]]:
    """{level name: {num_drafts, num_draft_tokens, num_accepted_tokens}} summed over other labels."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {k: 0.0 for k in _SPEC})
    for (name, labels), value in samples.items():
        for prefix in _PREFIXES:
            if not name.startswith(prefix):
                continue
            key = name[len(prefix):].removesuffix("_total")
            if key not in _SPEC:
                continue
            lab = dict(labels)
            level = lab.get("level") or ("vllm" if prefix.startswith("vllm") else "server")
            out[level][key] += value
    return dict(out)


def server_counters(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    """A few generic totals worth a before/after delta (request and token counts, server memory)."""
    wanted = {
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
        "specledger:prompt_tokens_total", "specledger:generation_tokens_total",
        "specledger:requests_total", "specledger:request_success_total", "process_resident_memory_bytes",
    }
    out: dict[str, float] = defaultdict(float)
    for (name, _labels), value in samples.items():
        if name in wanted:
            out[name] += value
    return dict(out)


def telemetry_delta(before: str | None, after: str | None) -> tuple[dict[str, Any] | None, list[Acceptance]]:
    """Compare two /metrics scrapes: raw deltas plus speculation counters as per-level acceptance."""
    if before is None or after is None:
        return None, []
    b, a = parse_prometheus(before), parse_prometheus(after)
    sb, sa = spec_counters(b), spec_counters(a)
    levels: list[Acceptance] = []
    spec: dict[str, dict[str, float]] = {}
    for level, counts in sa.items():
        prev = sb.get(level, {k: 0.0 for k in _SPEC})
        d = {k: counts[k] - prev[k] for k in _SPEC}
        spec[level] = d
        if d["num_draft_tokens"] > 0 or d["num_drafts"] > 0:
            proposed, accepted = int(d["num_draft_tokens"]), int(d["num_accepted_tokens"])
            levels.append(Acceptance(name=level, proposed=proposed, accepted=accepted,
                                     rate=accepted / proposed if proposed else None))
    cb, ca = server_counters(b), server_counters(a)
    deltas = {k: ca[k] - cb.get(k, 0.0) for k in ca if k != "process_resident_memory_bytes"}
    info: dict[str, Any] = {"spec_decode": spec, "counters": deltas}
    if "process_resident_memory_bytes" in ca:
        info["server_rss_bytes"] = ca["process_resident_memory_bytes"]
    for level, d in spec.items():
        if d["num_drafts"] > 0:  # each draft step appends its accepted tokens plus one bonus token
            info.setdefault("tau", {})[level] = 1.0 + d["num_accepted_tokens"] / d["num_drafts"]
    return info, levels


def response_levels(body: dict[str, Any]) -> tuple[list[LevelCounts], int | None, float | None, dict[str, Any]]:
    """Per-request speculation statistics carried in a response body or final chunk.

    Returns (levels, steps, tau, raw) from the `specledger` extension or llama.cpp `timings`.
    """
    ext = body.get("specledger")
    if isinstance(ext, dict):
        levels = [LevelCounts(name=str(lv.get("name", f"level{i}")), proposed=int(lv.get("proposed", 0)),
                              accepted=int(lv.get("accepted", 0)), steps=lv.get("steps"))
                  for i, lv in enumerate(ext.get("levels") or [])]
        return levels, ext.get("steps"), ext.get("tau"), {"specledger": ext}
    timings = body.get("timings")
    if isinstance(timings, dict):
        raw = {"timings": timings}
        if "draft_n" in timings:
            lv = LevelCounts(name="draft", proposed=int(timings["draft_n"]),
                             accepted=int(timings.get("draft_n_accepted", 0)))
            return [lv], None, None, raw
        return [], None, None, raw
    return [], None, None, {}


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


def reset_cuda_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def cuda_max_allocated() -> int | None:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return None

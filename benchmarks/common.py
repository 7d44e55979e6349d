"""Shared pieces of the benchmark scripts: prompts, the machine line, medians and tables."""

from __future__ import annotations

import os
import platform
import statistics
import time

import torch


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def long_prompts(n: int = 5) -> list[str]:
    """Prompts of ~100-300 tokens built from the built-in quality text, with different instructions."""
    from specledger.quality.agreement import default_text

    paras = [p for p in default_text().split("\n\n") if len(p) > 200]
    asks = [
        "Summarize the text above in three sentences.",
        "List the main facts of the text above as bullet points.",
        "Continue the text above with one more paragraph in the same style.",
        "Write three questions a teacher could ask about the text above, with answers.",
        "Explain the text above to a ten-year-old.",
        "Rewrite the text above as a short news article.",
    ]
    out = []
    for i in range(n):
        body = paras[i % len(paras)] + "\n\n" + paras[(i + 2) % len(paras)]
        out.append(f"{body}\n\n{asks[i % len(asks)]}")
    return out

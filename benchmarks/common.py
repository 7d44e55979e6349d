"""Shared pieces of the benchmark scripts: prompts, the machine line, medians and tables."""

from __future__ import annotations

import os
import platform
import statistics
import time

import psutil
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
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads{gpu}"


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def long_prompts(n: int = 5) -> list[str]:
    """Prompts of ~100-300 tokens built from the built-in quality text, with different instructions."""
    from specledger.data import quality_text

    paras = [p for p in quality_text().split("\n\n") if len(p) > 200]
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


def rss() -> int:
    return psutil.Process().memory_info().rss


def llamacpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class LlamaCpp:
    def __init__(self):
        from llama_cpp import Llama

        from specledger.engine.registry import resolve_model

        r0 = rss()
        # use_extra_bufts=False avoids the AMX crash on multi-token batches on this CPU (see the brief)
        nt = torch.get_num_threads()
        kw = dict(model_path=str(resolve_model("smollm2-135m")), n_ctx=2048, n_threads=nt, n_threads_batch=nt, verbose=False)
        try:
            self.llm = Llama(**kw, use_extra_bufts=False)
        except TypeError:
            self.llm = Llama(**kw)
        self.name, self.load_rss = "llama.cpp Q4_1", rss() - r0
        self.weight_bytes = os.path.getsize(kw["model_path"])

    def run(self, ids: list[int], n: int) -> dict:
        self.llm.reset()
        t0 = time.perf_counter()
        out, ttft = [], None
        for tok in self.llm.generate(ids, top_k=1, temp=0.0, reset=True):
            if ttft is None:
                ttft = time.perf_counter() - t0
            out.append(tok)
            if len(out) >= n:
                break
        return {"ttft": ttft, "total": time.perf_counter() - t0, "tokens": len(out), "ids": out}


def ab_table(title: str, cases: list[str], times: dict[tuple[str, str], list[float]], base: str, twin: str, new: str,
             levels: list[int], scale: float = 1e3, unit: str = "ms", digits: int = 1):
    """The A/B/A table of the side-by-side scripts: per case the medians of the base, its A/A twin and the new
    path, twin / base and new / base; cases named "... tok/s" print as rates, the others as seconds x scale in
    unit to `digits` decimals; with two or more closed-loop levels, each path's throughput at the last over the first."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("case", base, twin, new, f"A/A / {base}", f"{new} / {base}"):
        t.add_column(col, justify="right")
    for case in cases:
        med = {p: statistics.median(times[(case, p)]) for p in (base, twin, new)}
        show = (lambda v: f"{v:.1f}") if "tok/s" in case else (lambda v: f"{scale * v:.{digits}f} {unit}")
        t.add_row(case, *(show(med[p]) for p in (base, twin, new)), f"{med[twin] / med[base]:.3f}",
                  f"{med[new] / med[base]:.3f}")
    if len(levels) >= 2:
        for p in (base, new):
            hi = statistics.median(times[(f"AR c={levels[-1]} tok/s", p)])
            lo = statistics.median(times[(f"AR c={levels[0]} tok/s", p)])
            t.add_row(f"AR c={levels[-1]} / c={levels[0]} ({p})", "", "", "", "", f"{hi / lo:.2f}x")
    return t


def agreement_line(label: str, g) -> str:
    """One teacher-forced agreement result (quality.agreement) as the side-by-side scripts print it."""
    return (f"  {label} vs the fp32 model, {g.tokens} tokens teacher-forced: top-1 {g.top1_agreement:.2%}, "
            f"mean KL {g.mean_kl:.5f}, ppl {g.ppl_candidate:.3f} (fp32 {g.ppl_reference:.3f})")

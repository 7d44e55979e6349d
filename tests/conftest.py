"""Shared fixtures: a tiny random-weight model (fast), the batching tests' untied model, one torch thread, and the
embedded model (real)."""

from __future__ import annotations

import itertools

import pytest
import torch

from specledger.engine.config import ModelConfig
from specledger.engine.loader import LoadedModel, build_model, weight_bytes

# which of the quantized-product kernel's instruction-set paths this session ran (test_qkernel.py's `path` fixture
# records each: "ran" or "skipped: why"), said in one line at the end of the session
KERNEL_PATHS = pytest.StashKey[dict[str, str]]()


def pytest_terminal_summary(terminalreporter, config):
    seen = config.stash.get(KERNEL_PATHS, {})
    if seen:
        ran = [p for p, what in seen.items() if what == "ran"]
        rest = [f"{p} ({what})" for p, what in seen.items() if what != "ran"]
        terminalreporter.write_line(f"kernel paths: ran {', '.join(ran) or 'none'}"
                                    + (f"; {', '.join(rest)}" if rest else ""))


def tiny_config(vocab: int = 64, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, n_layers=layers, n_heads=heads,
        n_kv_heads=kv_heads, head_dim=hidden // heads, max_seq_len=256, rope_theta=10000.0, rms_eps=1e-5,
        tie_embeddings=True, eos_ids=[],
    )


def tiny_tensors(cfg: ModelConfig, seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def r(*shape, s=0.08):
        return torch.randn(*shape, generator=g) * s * scale

    t = {"embed": r(cfg.vocab_size, h, s=1.0), "norm": 1 + r(h, s=0.1)}
    for n in range(cfg.n_layers):
        p = f"layers.{n}"
        t |= {f"{p}.attn_norm": 1 + r(h, s=0.1), f"{p}.ffn_norm": 1 + r(h, s=0.1),
              f"{p}.q": r(cfg.n_heads * hd, h), f"{p}.k": r(cfg.n_kv_heads * hd, h), f"{p}.v": r(cfg.n_kv_heads * hd, h),
              f"{p}.o": r(h, cfg.n_heads * hd), f"{p}.gate": r(i, h), f"{p}.up": r(i, h), f"{p}.down": r(h, i)}
    return t


TEMP = 3.0  # the sampling tests' temperature: flattens the tiny model's distribution so every cell is exercised


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells with expected count < 5 are pooled."""
    n = counts.sum()
    exp = probs * n
    small = exp < 5
    obs_c = torch.cat([counts[~small], counts[small].sum(0, keepdim=True)])
    exp_c = torch.cat([exp[~small], exp[small].sum(0, keepdim=True)])
    keep = exp_c > 0
    stat = (((obs_c - exp_c) ** 2) / exp_c)[keep].sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat.double() / 2))


def exact_joint(lm, prompt, n=3, vocab=4):
    """P(t1..tn | prompt) for every sequence, by enumeration."""
    seqs = list(itertools.product(range(vocab), repeat=n))
    x = torch.tensor([prompt + list(s[:-1]) for s in seqs])
    with torch.no_grad():
        cache = lm.model.new_cache(x.shape[1], batch=len(seqs))
        logp = torch.log_softmax(lm.model(x, cache)[:, len(prompt) - 1 :] / TEMP, -1)
    idx = torch.tensor(seqs)
    return logp.gather(2, idx[..., None])[..., 0].sum(1).exp().double()


def tiny_model(seed: int = 0, dtype: str = "fp32", quant: str = "none", group_size: int = 32, scale: float = 1.0, **cfg_kw) -> LoadedModel:
    cfg = tiny_config(**cfg_kw)
    model = build_model(cfg, tiny_tensors(cfg, seed, scale), dtype=dtype, quant=quant, group_size=group_size)
    return LoadedModel(model=model, tokenizer=None, config=cfg, name=f"tiny{seed}",
                       source=f"random:tiny:{seed}:{scale}:{sorted(cfg_kw.items())}", dtype=dtype,
                       quant=quant, group_size=group_size if quant == "int4" else None, device="cpu",
                       weight_bytes=weight_bytes(model), load_s=0.0)


@pytest.fixture(scope="session")
def smollm():
    from specledger.engine.loader import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm_int4():
    from specledger.engine.loader import load_model

    return load_model("smollm2-135m", quant="int4")


PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Summarize: The committee met in November and agreed that the bridge stays open to pedestrians, lorries are diverted, and repairs start in spring. Summarize in one sentence.",
    "Write a Python function that checks whether a number is prime.",
    "Translate into French: The library opens at eight in the morning.",
]


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread avoids OpenMP hand-off costs that dominate otherwise."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    """The batching tests' untied model (varied_model.batching_model; a test file may define its own `lm`)."""
    from tests.support.varied_model import batching_model

    return batching_model()


@pytest.fixture
def require_tool():
    """An external program a test drives (llama-server, AIPerf, GuideLLM): skipped where it is absent, except
    where SPECLEDGER_REQUIRE_ENGINES=1 (set by .ci/run, which builds and installs them first): there its absence
    fails the test with the last lines of the build or install log, and the rest of the suite runs on."""
    import os
    from pathlib import Path

    def check(path: Path | None, what: str, how: str, log: Path | None = None) -> Path:
        if path is not None and path.exists():
            return path
        msg = f"{what} is not available: {how}"
        if not os.environ.get("SPECLEDGER_REQUIRE_ENGINES"):
            pytest.skip(msg)
        tail = ""
        if log is not None and log.is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            tail = f"\nlast lines of {log}:\n{tail}"
        pytest.fail(f"{msg} (SPECLEDGER_REQUIRE_ENGINES is set: the CI set-up step should have provided it){tail}",
                    pytrace=False)
        raise AssertionError  # unreachable: for type checkers

    return check

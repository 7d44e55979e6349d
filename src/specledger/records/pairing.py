"""Which autoregressive configuration each configuration is measured against: one rule for the lossless gate, the
quality source, the speed-ups (ledger, report, terminal tables).

A configuration's baseline is the first `ar` configuration of the run with the same target, run the same way
(backend; the device, the server's URL, or the engine of a server the run starts; model; precision) and the same
sampling. The same target at another precision is not a baseline (that difference is quantization's, which the
method-by-precision table shows), nor the in-process `ar` for a server's arms (another engine). An `ar`
configuration's baseline is the first such, itself when it is first: an A/A twin is measured against its elder.
What a configuration or a recorded result is as an Arm: records/config.py (config_arm, result_arm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol


class _Sampling(Protocol):
    temperature: float
    top_p: float
    top_k: int
    stop: list[str]


@dataclass(frozen=True)
class Arm:
    """What pairing reads of a configuration (a BenchConfig, a ConfigResult, a ConfigMeasurement)."""

    name: str
    strategy: str
    backend: str = ""
    where: str = ""  # the device, the server's URL, or "managed:<engine>" (a server the run starts)
    model: str = ""
    precision: str = ""  # precision_label's
    sampling: str = ""  # sampling_label's

    @property
    def key(self) -> tuple[str, ...]:
        return self.backend, self.where, self.model, self.precision, self.sampling


def baselines(arms: Iterable[Arm]) -> dict[str, str]:
    """Configuration name -> its baseline's name; a configuration without one in the run is absent."""
    arms = list(arms)
    first: dict[tuple[str, ...], str] = {}
    for a in arms:
        if a.strategy == "ar":
            first.setdefault(a.key, a.name)
    return {a.name: first[a.key] for a in arms if a.key in first}


def precision_label(dtype: str | None, quant: str | None, group_size: int | None, activations: int = 16) -> str:
    """fp32 / bf16 for plain weights; W8A16, W4A16-g32 (activation bits from dtype), W4A8-g32 when quantized."""
    if quant in (None, "", "none"):
        return dtype or "as served"
    act = 8 if activations == 8 else {"fp32": 32, "bf16": 16, "fp16": 16}.get(dtype or "", 16)
    bits = {"int8": 8, "int4": 4}.get(quant)
    label = f"W{bits}A{act}" if bits else quant
    return f"{label}-g{group_size}" if bits == 4 and group_size else label


def speedup(tok_s: float | None, base_tok_s: float | None) -> float | None:
    """The speed-up: output tok/s over its baseline's (the pairing above, at the same load and on the same items);
    None where either was not measured or is zero. The one ratio the ledger, the report and the run's tables show."""
    return tok_s / base_tok_s if tok_s and base_tok_s else None


def sampling_label(s: _Sampling) -> str:
    """'greedy' (top_p and top_k do not matter then), else the distribution sampled from; stop strings either way."""
    label = "greedy" if s.temperature == 0.0 else f"T={s.temperature:g} top_p={s.top_p:g} top_k={s.top_k}"
    return label + (f" stop={s.stop}" if s.stop else "")

"""The conditions a run was measured under: everything besides the configuration that moves a figure."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

import specledger
from specledger.records.results import Conditions


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect_conditions(config: dict[str, Any], *, seed: int, backends: dict[str, str], energy: str,
                       local_engine: bool = True) -> Conditions:
    """`local_engine`: the engine runs in this process, so its torch threads and GPU matter
    (an HTTP-only run records torch's version without paying for importing it)."""
    torch_version: str | None = None
    threads: int | None = None
    gpu: str | None = None
    kernel: str | None = None
    if local_engine or "torch" in sys.modules:
        try:
            import torch

            from specledger.engine import qkernel
            from specledger.engine.threads import count

            torch_version = torch.__version__
            threads = count()
            kernel = qkernel.describe() if local_engine else None
            gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        except ImportError:
            pass
    else:
        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            pass
    return Conditions(
        python=sys.version.split()[0],
        torch=torch_version,
        specledger=specledger.__version__,
        platform=platform.platform(),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count(),
        gpu=gpu,
        torch_threads=threads,
        kernel=kernel,
        seed=seed,
        backends=backends,
        energy=energy,
        config=config,
    )

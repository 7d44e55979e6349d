"""A backend by the configuration's name. Apart from base.py so the interface never imports its implementations
(each backend imports base; the heavy in-process one, torch included, only when asked for)."""

from __future__ import annotations

from typing import Any

from specledger.bench.backends.base import Backend
from specledger.records.config import BenchConfig


def make_backend(config: BenchConfig, **kwargs: Any) -> Backend:
    if config.backend == "openai":
        from specledger.bench.backends.openai_http import OpenAIBackend

        return OpenAIBackend(config, **kwargs)
    from specledger.bench.backends.inprocess import InProcessBackend

    return InProcessBackend(config, **kwargs)

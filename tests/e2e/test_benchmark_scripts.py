"""Every benchmark script still imports: they are the evidence BENCHMARKS.md cites, and nothing else runs them in CI,
so a name removed from src (session 22: `read_questions`, `generate_batch`) would break them unseen."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_benchmark_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import each other (common.py, concurrency.py)
    spec = importlib.util.spec_from_file_location(f"benchmark_{script[:-3]}", BENCHMARKS / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # top level only: every script runs its work under `if __name__ == "__main__"`
    assert module.__doc__, f"{script}: no docstring saying what it measures and how to run it"
    sys.modules.pop(spec.name, None)

"""--no-progress still says when each level is done: a long run is not silent for an hour."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from specledger.bench.runner import Runner
from specledger.records.config import parse_run_config
from tests.support.fake_backend import SleepBackend


def test_each_finished_level_prints_one_line_without_a_progress_bar(tmp_path: Path):
    w = tmp_path / "w.jsonl"
    w.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"word{i} please"],
                                     "reference": [f"word{i}"]}) + "\n" for i in range(3)))
    cfg = parse_run_config({"configs": [{"name": "a", "max_tokens": 5}, {"name": "b", "max_tokens": 5}],
                            "workload": {"spec": str(w)}, "load": {"concurrency": [1, 2], "warmup": 0},
                            "bootstrap": 0, "verify_curve": False})
    out = io.StringIO()
    calls: list[str] = []
    Runner(cfg, tmp_path / "run", show_progress=False, console=Console(file=out, width=300),
           backend_factory=lambda bc: SleepBackend(bc, calls, lambda n, bc: 0.0, tokens=5)).run()
    done = [line for line in out.getvalue().splitlines() if ": done, " in line]
    assert sorted(line.split(":")[0] for line in done) == ["a c=1", "a c=2", "b c=1", "b c=2"]
    assert all("3 requests ok, 15 tokens" in line for line in done), done


def test_a_graded_levels_line_counts_its_retries_and_its_own_wall_time(tmp_path: Path):
    from tests.bench.test_code_workload import CoderBackend, write_tasks

    cfg = parse_run_config({"configs": [{"name": "ar", "max_tokens": 64}],
                            "workload": {"spec": str(write_tasks(tmp_path / "t.jsonl"))},
                            "load": {"concurrency": [1], "warmup": 0},
                            "retry": {"attempts": 3, "temperature": 0.7, "seed": 11, "feedback": False},
                            "bootstrap": 0, "verify_curve": False, "calibration": False})
    out = io.StringIO()
    Runner(cfg, tmp_path / "run", show_progress=False, console=Console(file=out, width=300),
           backend_factory=lambda bc: CoderBackend(bc, [])).run()
    (line,) = [line for line in out.getvalue().splitlines() if ": done, " in line]
    # six tasks, greedy always wrong: 14 attempts of 10 tokens (test_code_workload), the first six in the records
    assert "6 requests ok, 60 tokens" in line and "8 retries: 140 tokens in all" in line, line
    assert line.endswith(" min"), line

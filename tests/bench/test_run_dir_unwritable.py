"""A run directory that stops taking writes mid-run (the disk full, remounted read-only): one line, exit 2, what
was measured kept whole on disk, and --resume, once it can write again, measures the rest (issue 56)."""

from __future__ import annotations

import errno
import os
import sys

import pytest

from specledger.bench.recorder import RunDirUnwritable
from specledger.records import durable, results
from specledger.records.results import REQUESTS_FILE, RUN_FILE, load_run, read_requests
from tests.bench.test_harness_crash import _check_complete_and_readable, _config, _expected_ids, _runner


def _fail_after(monkeypatch, n_records: int, code: int) -> None:
    """Every write fails with `code` once n_records records are in requests.jsonl (run.json's too, from then)."""
    written = {"n": 0}
    real_write_all, real_open = results._write_all, open

    def full() -> bool:
        return written["n"] >= n_records

    def write_all(fd: int, data: bytes) -> None:
        if full():
            os.write(fd, data[: len(data) // 3])  # the disk took a part of the line, then refused
            raise OSError(code, os.strerror(code))
        real_write_all(fd, data)
        written["n"] += 1

    def durable_open(path, mode="r", *args, **kw):
        if full() and "w" in mode:
            raise OSError(code, os.strerror(code))
        return real_open(path, mode, *args, **kw)

    monkeypatch.setattr(results, "_write_all", write_all)
    monkeypatch.setattr(durable, "open", durable_open, raising=False)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_run_directory_stops_in_one_line_and_resumes(tmp_path, monkeypatch, code):
    cfg, run_dir = _config(tmp_path), tmp_path / "run"
    n = len(_expected_ids()) // 2 + 1  # inside a level
    with monkeypatch.context() as m:
        _fail_after(m, n, code)
        with pytest.raises(RunDirUnwritable) as info:
            _runner(cfg, run_dir, resume=False).run()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"cannot write the run directory {run_dir}: {os.strerror(code)}")
    assert f"specledger bench --resume {run_dir}" in msg
    assert len(read_requests(run_dir, latest_only=False)) == n  # every record written is whole, none half
    assert (run_dir / REQUESTS_FILE).read_bytes().endswith(b"\n")
    assert load_run(run_dir).status == "running"  # the last run.json written whole
    _runner(cfg, run_dir, resume=True).run()
    _check_complete_and_readable(run_dir)


def test_a_run_directory_that_cannot_be_written_on_resume_is_one_line(tmp_path, monkeypatch, capsys):
    """Resume into a directory that refuses writes: one line, exit 2, its files untouched."""
    from specledger.cli import main

    cfg, run_dir = _config(tmp_path), tmp_path / "run"
    with monkeypatch.context() as m:
        _fail_after(m, 3, errno.ENOSPC)
        with pytest.raises(RunDirUnwritable):
            _runner(cfg, run_dir, resume=False).run()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    def refuse(self, run_dir):  # what os.open says in a read-only directory (root would not be refused by a chmod)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(run_dir / REQUESTS_FILE))

    monkeypatch.setattr(results.RequestLog, "__init__", refuse)
    monkeypatch.setattr(sys, "argv", ["specledger", "bench", "--resume", str(run_dir), "--no-progress"])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: cannot write the run directory {run_dir}: Permission")
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert RUN_FILE in before

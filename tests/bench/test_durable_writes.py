"""The files a run ends with (records/durable.py): a writer killed at a random point of its final writes leaves
the old run.json and summary.csv or the new ones, never an empty or torn one; and each is fsynced before its
rename, the directory after it (what survives a crash of the OS, which no kill can show)."""

from __future__ import annotations

import os
import random
import signal
import stat
import time

import pytest

from specledger.records import durable
from specledger.records.results import RUN_FILE, SUMMARY_FILE, load_run, write_run, write_summary
from tests.ledger.test_ledger_fixtures import DEFAULT_SPECS, make_run

TRIES = 200


def _texts(run_dir) -> tuple[str, str]:
    return (run_dir / RUN_FILE).read_text(encoding="utf-8"), (run_dir / SUMMARY_FILE).read_text(encoding="utf-8")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a forked writer")
def test_a_writer_killed_during_its_final_writes_leaves_the_old_files_or_the_new(tmp_path):
    old_dir = make_run(tmp_path / "old", DEFAULT_SPECS, n=40)
    new = load_run(old_dir)
    new.run_id, new.status = "new", "complete"
    new.configs = new.configs * 4  # ~4x the bytes: a write long enough to be cut
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    old = load_run(old_dir)
    write_run(run_dir, old)
    write_summary(run_dir, old)
    old_texts = _texts(run_dir)
    write_run(tmp_path, new)
    write_summary(tmp_path, new)
    new_texts = _texts(tmp_path)
    t0 = time.perf_counter()
    for run in (new, old):
        write_run(run_dir, run)
        write_summary(run_dir, run)
    cycle = time.perf_counter() - t0  # the writer's loop once round: kills spread over two of them
    rng = random.Random(0)
    seen: set[tuple[str, str]] = set()
    for i in range(TRIES):
        pid = os.fork()
        if pid == 0:  # the writer: the final writes, old and new in turn, until killed
            try:
                while True:
                    for run in (new, old):
                        write_run(run_dir, run)
                        write_summary(run_dir, run)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 2 * cycle))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        got = _texts(run_dir)
        assert got[0] in (old_texts[0], new_texts[0]), f"try {i}: run.json is {len(got[0])} bytes of neither"
        assert got[1] in (old_texts[1], new_texts[1]), f"try {i}: summary.csv is {len(got[1])} bytes of neither"
        seen.add(("old" if got[0] == old_texts[0] else "new", "old" if got[1] == old_texts[1] else "new"))
    assert len(seen) >= 2  # the kills landed at different points of the writes
    assert load_run(run_dir).run_id in ("synthetic", "new")


def test_each_file_is_fsynced_before_its_rename_and_the_directory_after(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", os.path.basename(dst)))
        real_replace(src, dst)

    run = load_run(make_run(tmp_path / "src", DEFAULT_SPECS[:1], n=2))
    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    write_run(tmp_path, run)
    write_summary(tmp_path, run)
    durable.write_text(tmp_path / "ledger.json", "{}")
    assert events == [("fsync", "file"), ("rename", RUN_FILE), ("fsync", "dir"),
                      ("fsync", "file"), ("rename", SUMMARY_FILE), ("fsync", "dir"),
                      ("fsync", "file"), ("rename", "ledger.json"), ("fsync", "dir")]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "ledger.json"
    durable.write_text(target, "old")
    with pytest.raises(RuntimeError), durable.replacing(target) as f:
        f.write("half of the new")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json"]

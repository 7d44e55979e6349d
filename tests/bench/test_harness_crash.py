"""Crash consistency of a run directory: a kill at any byte of requests.jsonl, then --resume, ends with every
request recorded exactly once and a run the ledger and the reports read (issue 42)."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.support.fake_backend import SleepBackend
from tests.support.fake_openai_server import FakeOpenAIServer, FakeSettings
from specledger.records.config import RunConfig, parse_run_config
from specledger.bench.recorder import RunRecorder
from specledger.records import results
from specledger.records.results import REQUESTS_FILE, RUN_FILE, RequestLog, RequestRecord, load_run, read_requests
from specledger.bench.runner import Runner
from specledger.errors import BadInput
from specledger.ledger.measurements import measurements_from_run

N_ITEMS, LEVELS, CONFIGS = 4, [1, 2], ["twin-a", "twin-b"]
TOKENS = 600  # a record of ~13 KB: larger than one write buffer


def _workload(tmp_path: Path) -> str:
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"word{i} please"],
                                     "reference": [f"word{i}"]}) + "\n" for i in range(N_ITEMS)))
    return str(p)


def _config(tmp_path: Path) -> RunConfig:
    return parse_run_config({
        "configs": [{"name": n, "max_tokens": TOKENS} for n in CONFIGS],
        "workload": {"spec": _workload(tmp_path)}, "load": {"concurrency": LEVELS, "warmup": 0},
        "bootstrap": 0, "interleave": False, "verify_curve": False,
    })


def _runner(cfg: RunConfig, run_dir: Path, *, resume: bool, console: Console | None = None) -> Runner:
    calls: list[str] = []
    return Runner(cfg, run_dir, resume=resume, show_progress=False, console=console or Console(file=io.StringIO()),
                  backend_factory=lambda bc: SleepBackend(bc, calls, lambda n, bc: 0.0, tokens=TOKENS))


def _expected_ids() -> list[str]:
    return sorted(f"{c}|c={lv}|{i}|t1" for c in CONFIGS for lv in LEVELS for i in range(N_ITEMS))


def _check_complete_and_readable(run_dir: Path) -> None:
    """Every request exactly once on disk, every level complete and pooled, the ledger prices it."""
    raw = read_requests(run_dir, latest_only=False)
    assert sorted(r.request_id for r in raw) == _expected_ids()
    run = load_run(run_dir)
    assert run.status == "complete"
    for c in run.configs:
        assert [lr.load for lr in c.loads] == [f"c={lv}" for lv in LEVELS]
        assert all(lr.complete and lr.aggregate.requests_ok == N_ITEMS for lr in c.loads)
    assert len(measurements_from_run(run_dir)) == len(CONFIGS) * len(LEVELS)


def _run_with_snapshots(tmp_path: Path, cfg: RunConfig, monkeypatch) -> tuple[bytes, list[tuple[int, bytes]]]:
    """A whole run; what run.json held each time it was written, with the size requests.jsonl had then (a kill at
    byte b of requests.jsonl finds on disk the last run.json written before the file passed b)."""
    snapshots: list[tuple[int, bytes]] = []
    save = RunRecorder.save

    def watched(self: RunRecorder) -> None:
        save(self)
        log = self.run_dir / REQUESTS_FILE
        snapshots.append((log.stat().st_size if log.exists() else 0, (self.run_dir / RUN_FILE).read_bytes()))

    with monkeypatch.context() as m:
        m.setattr(RunRecorder, "save", watched)
        _runner(cfg, tmp_path / "base", resume=False).run()
    return (tmp_path / "base" / REQUESTS_FILE).read_bytes(), snapshots


def test_kill_at_random_bytes_then_resume_records_every_request_once(tmp_path, monkeypatch):
    """200 kill points, each at a random byte of the run's requests.jsonl (most inside a record), with the
    run.json a process killed there leaves; resume completes the run."""
    cfg = _config(tmp_path)
    full, snapshots = _run_with_snapshots(tmp_path, cfg, monkeypatch)
    assert len(full) > len(_expected_ids()) * 8192  # records larger than one write buffer
    boundaries = {i + 1 for i, b in enumerate(full) if b == ord("\n")} | {0}
    rng = random.Random(42)
    torn = 0
    for seed in range(200):
        cut = rng.randrange(len(full) + 1) if seed else full.index(b"\n")  # seed 0: just before a newline
        run_dir = tmp_path / f"k{seed}"
        run_dir.mkdir()
        (run_dir / RUN_FILE).write_bytes(max((s for s in snapshots if s[0] <= cut), key=lambda s: s[0])[1])
        (run_dir / REQUESTS_FILE).write_bytes(full[:cut])
        if cut not in boundaries and seed:
            torn += 1
            assert len(read_requests(run_dir, latest_only=False)) == full[:cut].count(b"\n")  # readers go on
        out = io.StringIO()
        _runner(cfg, run_dir, resume=True, console=Console(file=out, width=400)).run()
        said = out.getvalue().count("cut a torn last record")
        assert said == (1 if cut not in boundaries and seed else 0), (seed, cut, out.getvalue())
        _check_complete_and_readable(run_dir)
        shutil.rmtree(run_dir)
    assert torn > 150  # most kill points tore a record



# ---- the real thing: `specledger bench` in a subprocess, SIGKILLed, then `--resume` ------------------------------

HTTP_ITEMS, HTTP_LEVELS, HTTP_TOKENS = 6, [1, 3], 600
HTTP_RECORD_BYTES = 16_000  # about, for HTTP_TOKENS (ITL list and text)


def _bench(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "specledger.cli", "bench", *args, "--no-progress"],
                                stdout=out, stderr=subprocess.STDOUT)


def _kill_until_done(cfg: Path, run_dir: Path, rng: random.Random, kills_left: int, seen: dict[str, int]) -> int:
    """Run, kill, resume ... until the run completes (no kill once kills_left is spent); returns the kills and
    counts in `seen` where they fell. A process that starts on a torn file and writes must say it cut it."""
    kills, requests = 0, run_dir / REQUESTS_FILE
    while True:
        fresh = not (run_dir / RUN_FILE).exists()  # killed before the run's first write: start it again
        args = [str(cfg), "--output-dir", str(run_dir.parent), "--run-id", run_dir.name] if fresh \
            else ["--resume", str(run_dir)]
        before = requests.read_bytes() if requests.exists() else b""
        log = run_dir.parent / f"{run_dir.name}.{seen.setdefault('processes', 0)}.log"
        seen["processes"] += 1
        proc = _bench(args, log)
        if kills < kills_left:
            if rng.random() < 0.15:  # at some moment of start-up (imports, reading the workload, run.json)
                deadline = time.monotonic() + rng.uniform(0.0, 2.0)
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.002)
            else:  # once requests.jsonl has grown by a random number of bytes (within ~3 records): mostly in one
                target = len(before) + rng.randrange(1, 3 * HTTP_RECORD_BYTES)
                while proc.poll() is None and (requests.stat().st_size if requests.exists() else 0) < target:
                    time.sleep(0.001)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
        else:
            proc.wait(timeout=120)
        assert proc.returncode in (0, -signal.SIGKILL), log.read_text()[-3000:]
        data = requests.read_bytes() if requests.exists() else b""
        wrote = data != before[:len(data)]  # more than a cut: it got past the repair
        if _torn(before) and wrote:
            said = [ln for ln in log.read_text().splitlines()  # its console line (the run's notes repeat it later)
                    if ln.startswith(f"{requests}:") and "cut a torn last record" in ln]
            assert len(said) == 1, log.read_text()[-3000:]
            seen["resumed a torn file, said so"] = seen.get("resumed a torn file, said so", 0) + 1
        if proc.returncode == 0:
            return kills
        where = "in start-up (nothing written)" if not wrote else "torn" if _torn(data) else "between records"
        if where == "between records" and (rng.random() < 0.5 or "between records, then torn by the test" not in seen):
            # a kill inside a record's write is rare on a fast disk (the kernel copies a whole line at once): tear
            # the last record at a random byte, as such a kill would have
            last = data.rfind(b"\n", 0, len(data) - 1) + 1
            os.truncate(requests, rng.randrange(last + 1, len(data) - 1))
            where = "between records, then torn by the test"
        seen[where] = seen.get(where, 0) + 1


def _torn(data: bytes) -> bool:
    tail = data[data.rfind(b"\n") + 1:]
    return bool(tail) and not _is_record(tail)


def _is_record(line: bytes) -> bool:
    try:
        RequestRecord.model_validate_json(line)
        return True
    except ValueError:
        return False


def _http_config(tmp_path: Path, base_url: str) -> Path:
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"q{i}"]}) + "\n"
                          for i in range(HTTP_ITEMS)))
    cfg = {"configs": [{"name": "srv", "backend": "openai", "model": "fake-model", "max_tokens": HTTP_TOKENS,
                        "openai": {"base_url": base_url, "connect_timeout_s": 5, "timeout_s": 30,
                                   "extra_body": {"fake": {"tokens_per_chunk": 50}}}}],
           "workload": {"spec": str(wl)}, "load": {"concurrency": HTTP_LEVELS, "warmup": 0}, "bootstrap": 0}
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def _sigkill_runs(tmp_path: Path, kill_points: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    expected = sorted(f"srv|c={lv}|{i}|t1" for lv in HTTP_LEVELS for i in range(HTTP_ITEMS))
    done, runs, seen = 0, 0, {"runs": 0}
    with FakeOpenAIServer(FakeSettings()) as srv:
        cfg = _http_config(tmp_path, srv.base_url)
        while done < kill_points:
            run_dir = tmp_path / "runs" / f"r{runs}"
            run_dir.parent.mkdir(exist_ok=True)
            done += _kill_until_done(cfg, run_dir, rng, kill_points - done, seen)
            runs = seen["runs"] = runs + 1
            raw = read_requests(run_dir, latest_only=False)
            assert sorted(r.request_id for r in raw) == expected  # every request exactly once
            assert all(len(r.output_text) == HTTP_TOKENS * 5 for r in raw)
            run = load_run(run_dir)
            assert run.status == "complete" and all(lr.complete for lr in run.configs[0].loads)
            assert len(measurements_from_run(run_dir)) == len(HTTP_LEVELS)
    print(f"{done} kill points: {seen}")
    return seen | {"kills": done}


def test_sigkill_during_bench_then_resume(tmp_path):
    """specledger bench against a fake OpenAI server, SIGKILLed at random moments (mostly while requests.jsonl
    grows by ~13 KB records), resumed until it completes."""
    seen = _sigkill_runs(tmp_path, kill_points=10, seed=1)
    assert seen["kills"] == 10 and seen["resumed a torn file, said so"] >= 1


@pytest.mark.slow
def test_sigkill_during_bench_then_resume_many(tmp_path):
    n = int(os.environ.get("SPECLEDGER_KILL_POINTS", "40"))
    assert _sigkill_runs(tmp_path, kill_points=n, seed=2)["kills"] == n


def test_readers_go_on_past_a_torn_last_record_and_say_so(tmp_path, monkeypatch, capsys):
    cfg = _config(tmp_path)
    _runner(cfg, tmp_path / "r", resume=False).run()
    log = tmp_path / "r" / REQUESTS_FILE
    with open(log, "ab") as f:
        f.write(b'{"schema_version": 1, "run_id": "r", "conf')  # a kill mid-write
    capsys.readouterr()
    assert len(measurements_from_run(tmp_path / "r")) == len(CONFIGS) * len(LEVELS)  # the ledger reads it
    assert f"{log}:{len(_expected_ids()) + 1}: torn last record" in capsys.readouterr().err


def test_a_failed_write_leaves_no_partial_line(tmp_path, monkeypatch):
    """A write that fails half way (disk full) is cut back, so the next record starts a line of its own."""
    cfg = _config(tmp_path)
    _runner(cfg, tmp_path / "r", resume=False).run()
    recs = read_requests(tmp_path / "r")
    before = (tmp_path / "r" / REQUESTS_FILE).read_bytes()
    write_all = results._write_all

    def half_then_full(fd: int, data: bytes) -> None:
        write_all(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    with RequestLog(tmp_path / "r") as log:
        monkeypatch.setattr(results, "_write_all", half_then_full)
        with pytest.raises(OSError):
            log.append(recs[0])
        assert (tmp_path / "r" / REQUESTS_FILE).read_bytes() == before
        monkeypatch.setattr(results, "_write_all", write_all)
        log.append(recs[1])
    assert len(read_requests(tmp_path / "r", latest_only=False)) == len(recs) + 1


def test_a_run_poisoned_by_an_older_resume_is_read_again(tmp_path, capsys):
    """Before the cut on resume, the next record landed on the torn line: that line's whole record is read (with
    a warning), so cost and report take such a run again, and resuming it goes on."""
    cfg = _config(tmp_path)
    _runner(cfg, tmp_path / "r", resume=False).run()
    log = tmp_path / "r" / REQUESTS_FILE
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:3]) + lines[3][:5000] + b"".join(lines[4:]))  # record 4 torn, 5 on its line
    capsys.readouterr()
    raw = read_requests(tmp_path / "r", latest_only=False)
    assert len(raw) == len(lines) - 1 and raw[3].model_dump_json().encode() + b"\n" == lines[4]
    assert f"{log}:4: a torn record, then a whole one" in capsys.readouterr().err
    assert len(measurements_from_run(tmp_path / "r")) == len(CONFIGS) * len(LEVELS)
    # no whole record after the tear: still an error naming the line
    log.write_bytes(b"".join(lines[:3]) + lines[3][:5000] + lines[4][10:] + b"".join(lines[5:]))
    with pytest.raises(BadInput, match=r"requests.jsonl:4: not a request record"):
        read_requests(tmp_path / "r")


def test_a_complete_level_whose_last_record_is_cut_is_measured_again(tmp_path):
    """run.json says every level is complete, but requests.jsonl lost its last record (torn and cut on resume):
    the level is reopened and the missing request measured, not skipped with a request short."""
    cfg = _config(tmp_path)
    run_dir = tmp_path / "run"
    _runner(cfg, run_dir, resume=False).run()
    log = run_dir / REQUESTS_FILE
    data = log.read_bytes()
    last = data.rfind(b"\n", 0, len(data) - 1) + 1
    os.truncate(log, last + (len(data) - last) // 2)  # the last record torn halfway
    _runner(cfg, run_dir, resume=True).run()
    _check_complete_and_readable(run_dir)
    assert any("records are gone from requests.jsonl: measured again" in n for n in load_run(run_dir).notes)

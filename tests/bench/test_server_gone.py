"""A target server killed mid-run (issue 56): the level is not complete, the run says the server went away and exits
2, and --resume (the server back) measures exactly what is missing, so every request ends measured once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from specledger.records.results import REQUESTS_FILE, load_run, read_requests

FAKE = str(Path(__file__).parents[1] / "support" / "fake_openai_server.py")
ITEMS, LEVELS = 12, [1, 3]
EXPECTED = sorted(f"srv|c={lv}|{i}|t1" for lv in LEVELS for i in range(ITEMS))


def _config(tmp_path: Path, openai: dict) -> Path:
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"q{i}"]}) + "\n"
                          for i in range(ITEMS)))
    cfg = {"configs": [{"name": "srv", "backend": "openai", "model": "fake-model", "max_tokens": 8,
                        "openai": {"connect_timeout_s": 5, "timeout_s": 30, **openai}}],
           "workload": {"spec": str(wl)}, "load": {"concurrency": LEVELS, "warmup": 0}, "bootstrap": 0,
           "calibration": False}
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))
    return path


def _fake_server(port: int = 0) -> tuple[subprocess.Popen, int]:
    """The fake server in its own process (0.05 s between chunks: a request takes ~0.4 s); its port."""
    proc = subprocess.Popen([sys.executable, FAKE, "--port", str(port), "--gap", "0.05"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    return proc, int(line.split()[1])


def _bench(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specledger.cli", "bench", *args, "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _records(run_dir: Path) -> int:
    path = run_dir / REQUESTS_FILE
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _kill_when_recorded(bench: subprocess.Popen, run_dir: Path, n: int, victim: psutil.Process | None = None) -> None:
    """SIGKILL the server once n requests are on disk (the managed one: found among the bench's children)."""
    while _records(run_dir) < n:
        assert bench.poll() is None, bench.communicate()
        time.sleep(0.01)
    if victim is None:
        victim = next(p for p in psutil.Process(bench.pid).children(recursive=True)
                      if FAKE in " ".join(p.cmdline()))
    victim.send_signal(signal.SIGKILL)


def _said_gone(bench: subprocess.Popen) -> str:
    out, err = bench.communicate(timeout=120)
    assert bench.returncode == 2, (out, err)
    assert "Traceback" not in err and "the server went away during srv c=" in err, err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1, err
    return err


def _check_stopped(run_dir: Path, killed_after: int) -> None:
    run = load_run(run_dir)
    assert run.status == "failed" and any("the server went away" in n for n in run.notes)
    assert not all(lr.complete for lr in run.configs[0].loads) or len(run.configs[0].loads) < len(LEVELS)
    recs = read_requests(run_dir, latest_only=False)
    assert all(r.status == "ok" for r in recs)  # no connect failures recorded for a dead server
    assert killed_after <= len(recs) < len(EXPECTED)


def _check_resumed(bench: subprocess.Popen, run_dir: Path) -> None:
    out, err = bench.communicate(timeout=120)
    assert bench.returncode == 0, (out, err)
    recs = read_requests(run_dir, latest_only=False)
    assert sorted(r.request_id for r in recs) == EXPECTED  # every request measured once
    assert all(r.status == "ok" for r in recs)
    run = load_run(run_dir)
    assert run.status == "complete" and all(lr.complete for lr in run.configs[0].loads)
    assert all(lr.aggregate.requests_ok == ITEMS and lr.aggregate.requests_failed == 0 for lr in run.configs[0].loads)


def test_own_server_killed_mid_run_then_restarted_and_resumed(tmp_path):
    server, port = _fake_server()
    run_dir = tmp_path / "runs" / "r"
    try:
        bench = _bench([str(_config(tmp_path, {"base_url": f"http://127.0.0.1:{port}"})),
                        "--output-dir", str(run_dir.parent), "--run-id", "r"])
        _kill_when_recorded(bench, run_dir, ITEMS + 2, psutil.Process(server.pid))  # inside the c=3 level
        server.wait()
        _said_gone(bench)
        _check_stopped(run_dir, ITEMS + 2)
        server, _ = _fake_server(port)  # back on its port
        _check_resumed(_bench(["--resume", str(run_dir)]), run_dir)
    finally:
        server.kill()
        server.wait()


def test_managed_server_killed_mid_run_is_started_again_by_resume(tmp_path):
    cfg = _config(tmp_path, {"server": {"command": "{python} " + FAKE + " --port {port} --gap 0.05",
                                        "startup_timeout_s": 30}})
    run_dir = tmp_path / "runs" / "m"
    bench = _bench([str(cfg), "--output-dir", str(run_dir.parent), "--run-id", "m"])
    _kill_when_recorded(bench, run_dir, 3)  # inside the c=1 level
    err = _said_gone(bench)
    assert "exited with status" in err or "refuses connections" in err
    _check_stopped(run_dir, 3)
    _check_resumed(_bench(["--resume", str(run_dir)]), run_dir)


def test_a_server_being_torn_down_is_asked_again_until_it_refuses():
    """Between SIGKILL and the end of its process a server's listening socket still takes connections and drops them:
    no answer either way. The probe asks again until the server answers or refuses (it failed the killed-server test
    on a loaded host when it gave up after two such drops and called the server alive)."""
    import asyncio
    import socket

    import httpx

    from specledger.bench.backends.openai_http import refusing

    async def main() -> str | None:
        drops = 0

        async def drop(reader, writer):  # accept, read the request, close without a byte: a transport error
            nonlocal drops
            drops += 1
            await reader.read(100)
            writer.close()

        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def die_later():
            while drops < 4:  # four dropped connections, then the socket is gone
                await asyncio.sleep(0.01)
            server.close()
            await server.wait_closed()

        killer = asyncio.create_task(die_later())
        async with httpx.AsyncClient() as client:
            said = await refusing(client, [f"http://127.0.0.1:{port}"], timeout=5.0)
        if not killer.done():  # it answered before the socket went: called alive
            killer.cancel()
            server.close()
            return said
        with socket.socket() as s:  # the port refuses now
            assert s.connect_ex(("127.0.0.1", port)) != 0
        return said

    said = asyncio.run(main())
    assert said is not None and "refuses connections" in said

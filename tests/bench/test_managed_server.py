"""Managed servers (bench/managed.py): start on a free port, wait for health, stop on every way out."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from specledger.bench.backends.openai_http import OpenAIBackend, Unauthorized
from specledger.records.config import BenchConfig, ServerSettings, parse_run_config
from specledger.bench.managed import ManagedServer, render_command
from specledger.records.results import read_requests
from specledger.bench.runner import run_benchmark
from specledger.errors import BadInput, SpecLedgerError

FAKE = str(Path(__file__).parents[1] / "support" / "fake_openai_server.py")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens there (connections in TIME_WAIT do not count: servers bind with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False

# A server with /health that ignores SIGTERM and leaves a grandchild in its process group: only SIGKILL to
# the group ends both. It writes the grandchild's pid next to itself.
STUBBORN = textwrap.dedent("""
    import http.server, os, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    open(sys.argv[2], "w").write(str(child.pid))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            print("GET", self.path, flush=True)
    print("stubborn up", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by a parent that is not us) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def eventually(check, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def gone(pid: int, within: float = 5.0) -> bool:
    return eventually(lambda: not alive(pid), within)


def test_fake_server_started_probed_and_stopped(tmp_path):
    log = tmp_path / "srv.log"
    s = ManagedServer(ServerSettings(command="{python} " + FAKE + " --port {port}", startup_timeout_s=30), model="m",
                      log_path=log)
    with s as url:
        pid, port = s.proc.pid, s.port
        assert url == f"http://127.0.0.1:{port}"
        # the fake has no /health (404): the probe fell back to /v1/models
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "fake-model"
        assert not port_is_free(port)
    assert s.proc is None and gone(pid) and port_is_free(port)
    text = log.read_text()
    assert text.startswith("# ") and f"--port {port}" in text.splitlines()[0]  # the command as run heads the log
    assert "PORT" in text  # the server's own output is in the log


def test_server_that_dies_is_one_line_with_its_last_log_lines(tmp_path):
    cmd = "{python} -c \"import sys; print('loading weights'); print('bad flag --frobnicate'); sys.exit(3)\""
    s = ManagedServer(ServerSettings(command=cmd, startup_timeout_s=30), model="m", log_path=tmp_path / "x.log")
    with pytest.raises(SpecLedgerError) as e:
        s.start()
    msg = str(e.value)
    assert "\n" not in msg and "status 3" in msg and "bad flag --frobnicate" in msg and "loading weights" in msg
    assert s.proc is None


def test_server_never_healthy_times_out_and_is_stopped(tmp_path):
    cmd = "{python} -c \"import time; print('still loading', flush=True); time.sleep(120)\""
    s = ManagedServer(ServerSettings(command=cmd, startup_timeout_s=1.5, stop_grace_s=2), model="m",
                      log_path=tmp_path / "x.log")
    t0 = time.monotonic()
    with pytest.raises(SpecLedgerError, match=r"not healthy after 1.5 s .*still loading"):
        s.start()
    assert time.monotonic() - t0 < 10
    assert s.proc is None


def test_sigterm_ignored_means_sigkill_to_the_whole_group(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    pidfile = tmp_path / "child.pid"
    s = ManagedServer(ServerSettings(command=f"{{python}} {script} {{port}} {pidfile}", health="/health",
                                     startup_timeout_s=30, stop_grace_s=0.5), model="m", log_path=tmp_path / "s.log")
    s.start()
    pid, child = s.proc.pid, int(pidfile.read_text())
    assert alive(child)
    t0 = time.monotonic()
    rc = s.stop()
    assert rc == -signal.SIGKILL and time.monotonic() - t0 >= 0.5
    assert gone(pid) and gone(child)  # the grandchild went with the group


def _parent_script(tmp_path: Path) -> Path:
    """A specledger-like process that starts a server, prints its pid and port, then waits to be killed."""
    p = tmp_path / "parent.py"
    # SIGINT as a run at a terminal has it: a process started with SIGINT ignored (a background job of a script, or
    # a test process that ignores it) would pass that on, and the run would outlive the SIGINT it is sent
    p.write_text(textwrap.dedent(f"""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from specledger.records.config import ServerSettings
        from specledger.bench.managed import ManagedServer
        s = ManagedServer(ServerSettings(command="{{python}} {FAKE} --port {{port}}", startup_timeout_s=60), model="m",
                          log_path=sys.argv[1])
        s.start()
        print(s.proc.pid, s.port, flush=True)
        time.sleep(600)
    """))
    return p


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_killed_run_leaves_no_server_behind(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, str(_parent_script(tmp_path)), str(tmp_path / "s.log")],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = parent.stdout.readline()
        assert line, (tmp_path / "s.log").read_text() if (tmp_path / "s.log").exists() else "no log"
        pid, port = map(int, line.split())
        assert alive(pid)
        parent.send_signal(sig)
        parent.wait(30)
        assert gone(pid, 15), f"server {pid} outlived its parent killed by {sig!r}"
        # a zombie leader's other threads may hold the socket a moment longer
        assert eventually(lambda: port_is_free(port), 10)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_templates_are_checked_when_the_config_is_read():
    with pytest.raises(BadInput, match=r"unknown placeholder \{gpu\}"):
        parse_run_config({"configs": [{"name": "a", "backend": "openai",
                                       "openai": {"server": {"command": "vllm serve {model} --port {port} {gpu}"}}}]})
    argv = render_command("{python} -m specledger.cli serve --model '{model}' --port {port}", host="127.0.0.1",
                          port=1234, model="my model", run_dir=Path("/tmp"))
    assert argv == [sys.executable, "-m", "specledger.cli", "serve", "--model", "my model", "--port", "1234"]
    assert ServerSettings(command="{llama_server} -m {model_path} --port {port}").engine() == "llama_server"
    assert ServerSettings(command="python -m sglang.launch_server --port {port}").engine() == \
        "python -m sglang.launch_server"


def test_bench_run_starts_the_configured_server_and_keeps_its_log(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"q{i}"]}) + "\n"
                          for i in range(3)))
    server = {"command": "{python} " + FAKE + " --port {port}", "startup_timeout_s": 30}
    cfg = parse_run_config({
        "configs": [{"name": "fake srv", "backend": "openai", "model": "fake-model", "max_tokens": 4,
                     "openai": {"server": server, "connect_timeout_s": 5}}],
        "workload": {"spec": str(wl)}, "load": {"concurrency": [1, 2], "warmup": 0}, "bootstrap": 0,
        "verify_curve": False,
    })
    result, path = run_benchmark(cfg, run_dir=tmp_path / "run", show_progress=False)
    recs = read_requests(path)
    assert len(recs) == 6 and all(r.status == "ok" and r.output_tokens == 4 for r in recs)
    log = path / "server-fake_srv.log"
    first = log.read_text().splitlines()[0]
    port = int(first.split("--port ")[1].split()[0])
    assert port_is_free(port)  # stopped after the run
    assert "managed" in result.conditions.backends["fake srv"]


def start_and_close(b: OpenAIBackend) -> str:
    """Start the backend (its managed server too), close it whatever happens; the models it found."""
    async def go() -> str:
        try:
            await b.start()
            return b._models
        finally:
            await b.close()

    return asyncio.run(go())


def test_a_managed_server_answering_401_while_starting_is_unauthorized_at_once(tmp_path, monkeypatch):
    """A keyed server whose health path is /v1/models answers 401 to the keyless health probe: it is up, and the
    backend's own wait (with the key) names the refused key, instead of polling until startup_timeout_s and
    calling the server unhealthy."""
    monkeypatch.setenv("FAKE_KEY", "stale")
    server = {"command": "{python} " + FAKE + " --port {port} --api-key k", "startup_timeout_s": 20}
    bc = BenchConfig(name="keyed", backend="openai", model="fake-model", max_tokens=3,
                     openai={"server": server, "connect_timeout_s": 5, "api_key_env": "FAKE_KEY",
                             "scrape_metrics": False})
    b = OpenAIBackend(bc, log_dir=tmp_path)
    t0 = time.monotonic()
    with pytest.raises(Unauthorized, match=r"answered HTTP 401 \(Invalid API key\): the key in the environment "
                                           r"variable FAKE_KEY \(api_key_env\) was refused"):
        start_and_close(b)
    assert time.monotonic() - t0 < 15  # not startup_timeout_s of polling
    assert b.server is not None and b.server.proc is None  # stopped on the way out

    monkeypatch.setenv("FAKE_KEY", "k")  # the right key: up and reachable
    assert start_and_close(OpenAIBackend(bc, log_dir=tmp_path)) == "models: fake-model"


def test_interleaved_managed_servers_each_keep_their_own_counters(tmp_path):
    """Two managed servers measured request by request (interleaved, c=1): each is its own server, so each
    configuration gets its own /metrics window (their configured base_url is the same unused default)."""
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"q{i}"]}) + "\n"
                          for i in range(3)))
    configs = [{"name": f"fake{acc}", "backend": "openai", "model": "fake-model", "max_tokens": 4,
                "openai": {"server": {"command": "{python} " + FAKE + f" --port {{port}} --spec-steps 2 "
                                      f"--accepted-per-step {acc}", "startup_timeout_s": 30}}} for acc in (1, 2)]
    cfg = parse_run_config({"configs": configs, "workload": {"spec": str(wl)}, "interleave": True,
                            "load": {"concurrency": [1], "warmup": 0}, "bootstrap": 0, "verify_curve": False})
    result, _ = run_benchmark(cfg, run_dir=tmp_path / "run", show_progress=False)
    assert result.conditions.interleaved
    for acc in (1, 2):
        lr = result.config(f"fake{acc}").loads[0]
        theirs = {a.name: a for a in lr.telemetry_levels}["vllm"]
        assert (theirs.proposed, theirs.accepted) == (3 * 2 * 3, 3 * 2 * acc)


@pytest.mark.slow
def test_bench_on_a_managed_specledger_serve(tmp_path):
    """The project's own server as a managed contender: started, measured, its counters read, stopped."""
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"question_id": "q", "category": "copy",
                              "turns": ["Repeat exactly: one two three, one two three, one two three."]}) + "\n")
    server = {"command": "{python} -m specledger.cli serve --model {model} --host {host} --port {port} "
                         "--strategy lookup -p draft_length=fixed --max-seq-len 512 --log-level warning",
              "startup_timeout_s": 400}  # fixed: drafts every step (the planner may draft nothing on a busy host)
    cfg = parse_run_config({
        "configs": [{"name": "serve-lookup", "backend": "openai", "model": "smollm2-135m", "strategy": "lookup",
                     "max_tokens": 16, "openai": {"server": server}}],
        "workload": {"spec": str(wl)}, "load": {"concurrency": [1], "num_requests": 2, "warmup": 0},
        "bootstrap": 0, "verify_curve": False,
    })
    result, path = run_benchmark(cfg, run_dir=tmp_path / "run", show_progress=False)
    recs = read_requests(path)
    assert len(recs) == 2 and all(r.status == "ok" for r in recs)
    lr = result.config("serve-lookup").loads[0]
    ours = {a.name: a for a in lr.aggregate.acceptance}
    theirs = {a.name: a for a in lr.telemetry_levels}
    assert theirs and set(theirs) <= set(ours)
    for name, a in theirs.items():  # the server's counters over the window = the sum of its responses
        assert (a.proposed, a.accepted) == (ours[name].proposed, ours[name].accepted)
    port = int((path / "server-serve-lookup.log").read_text().splitlines()[0].split("--port ")[1].split()[0])
    assert port_is_free(port)


@pytest.mark.slow
def test_twenty_start_stop_cycles_leave_nothing_behind(tmp_path):
    """The issue's goal: 20 cycles of five kinds, four each -- stopped after use, abandoned mid-start by a failing
    health wait, and a run (the process that started the server) killed with SIGKILL, SIGTERM or SIGINT."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    parent_script = _parent_script(tmp_path)
    kinds = ["stop", "abandoned", signal.SIGKILL, signal.SIGTERM, signal.SIGINT]
    pids, ports, seen = [], [], {str(k): 0 for k in kinds}
    for i in range(20):
        kind = kinds[i % len(kinds)]
        if isinstance(kind, signal.Signals):
            parent = subprocess.Popen([sys.executable, str(parent_script), str(tmp_path / f"{i}.log")],
                                      stdout=subprocess.PIPE, text=True, env=env)
            try:
                pid, port = map(int, parent.stdout.readline().split())
                parent.send_signal(kind)
                parent.wait(30)
            finally:
                if parent.poll() is None:
                    parent.kill()
            pids.append(pid)
            ports.append(port)
            seen[str(kind)] += 1
            continue
        s = ManagedServer(ServerSettings(command="{python} " + FAKE + " --port {port}",
                                         health="/health-that-404s" if kind == "abandoned" else None,
                                         startup_timeout_s=1.0 if kind == "abandoned" else 30),
                          model="m", log_path=tmp_path / f"{i}.log")
        try:
            s.start()
            pids.append(s.proc.pid)
            ports.append(s.port)
        except SpecLedgerError:
            assert kind == "abandoned"
            seen[kind] += 1
            if s.port:
                ports.append(s.port)
        else:
            assert kind == "stop"
            seen[kind] += 1
        finally:
            s.stop()
    assert set(seen.values()) == {4} and len(pids) == 16
    assert all(gone(p, 15) for p in pids), [p for p in pids if alive(p)]
    assert all(eventually(lambda p=p: port_is_free(p), 10) for p in ports)

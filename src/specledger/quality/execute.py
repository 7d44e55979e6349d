"""Execution grading: a code answer passes when its program runs the task's tests without failing.

The answer's code is extracted (`extract_program`): a fenced block (```python ... ```, an unclosed last fence
of an answer cut at max_tokens included), a chat answer's code without fences, or a completion that continues
the prompt (an indented function body). A block that defines the entry point is run after the prompt (the
prompt's imports and helpers stay defined; the answer's definition wins); anything else is taken to continue
the prompt. Of that program, the imports, functions, classes and the module-level names they read are run; the
model's own top-level demo (prints, asserts of what it expects) is not, as in EvalPlus's sanitizer.

`run_tests` runs the program and the tests in a separate process (the sandbox):
- its own temporary directory (the working directory, deleted afterwards), stdin closed, stdout and stderr
  into files capped by RLIMIT_FSIZE (a flood is killed at the cap);
- RLIMIT_CPU (CPU seconds), RLIMIT_AS (memory), RLIMIT_NPROC (processes), RLIMIT_CORE 0;
- a wall-clock timeout, at which the whole process group is killed (start_new_session);
- where the OS allows (root, and `unshare` works): new network and PID namespaces (`unshare -n -p -f
  --kill-child`: no network but a loopback that is down; every process it forked dies with it, even one that
  left the process group), and the code runs as an unprivileged uid of its own per concurrent slot, so the
  process limit holds (root ignores RLIMIT_NPROC) and one slot's fork bomb cannot starve another's.
  `sandbox_description()` says which of these this machine gave.
The solution runs with __name__ != "__main__" (an `if __name__ == "__main__":` demo neither runs nor reads
stdin), then the tests' `check(entry_point)`. Outcomes: passed; failed (an AssertionError: the failing test
line kept); error (an exception, a syntax error, an exit, nothing extracted, the output cap); timeout.
Not a security boundary against code written to escape: it contains accidents and runaway answers.
"""

from __future__ import annotations

import ast
import functools
import os
import queue
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specledger.records.question import CodeTask

Outcome = Literal["passed", "failed", "error", "timeout"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "failed", "error", "timeout")
SLOT_UID_BASE = 61000  # slot k runs as uid/gid SLOT_UID_BASE + k (no passwd entry needed)
MAX_SLOTS = 64  # runs at once (more wait for a slot)
MESSAGE_CHARS = 600


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock, the whole process group killed at it
    cpu_s: int = 10  # RLIMIT_CPU
    memory_bytes: int = 1 << 30  # RLIMIT_AS
    processes: int = 16  # RLIMIT_NPROC (per slot uid, where the uid is switched)
    output_bytes: int = 1 << 20  # RLIMIT_FSIZE: stdout and stderr files each


@dataclass(frozen=True)
class ExecResult:
    outcome: Outcome
    message: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


# --- extraction --------------------------------------------------------------------------------------------

# a fence, its language (on the fence's line, or alone on the next: "```\npython\n", as a small model writes it)
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(?:(?i:python3?|py)[ \t]*\n)?(.*?)(?:```|\Z)", re.DOTALL)
_CODE_START = re.compile(r"^(?:def |async def |class |import |from |@)", re.MULTILINE)
_NOT_PYTHON = {"bash", "sh", "shell", "console", "text", "json", "yaml", "output", "plaintext"}


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def extract_code(answer: str, entry_point: str) -> str | None:
    """The code an answer gives: the fenced block defining the entry point (else the first Python block), a
    chat answer's code from its first def/import line, or the answer itself as a continuation; None: none."""
    if not answer or not answer.strip():
        return None
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(answer)]
    blocks = [(lang, body) for lang, body in blocks if body.strip() and lang not in _NOT_PYTHON]
    if blocks:
        defining = [body for _, body in blocks if _defines(body, entry_point)]
        return (defining or [blocks[0][1]])[0]
    if _defines(answer, entry_point) and not answer.startswith((" ", "\t")):
        m = _CODE_START.search(answer)
        return answer[m.start():] if m else answer
    return answer  # a completion continuing the prompt


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


_TOP_DEFINITION = re.compile(r"(?:async\s+def|def|class)\s|@")


def _parsable_head(program: str) -> tuple[str, ast.Module] | None:
    """The longest head of whole lines that parses and defines something, with its tree, where the lines cut off
    begin no top-level definition (only a demo's tail is cut: a broken function keeps its syntax error)."""
    lines = program.splitlines()
    for end in range(len(lines) - 1, 0, -1):
        if _TOP_DEFINITION.match(lines[end]):
            return None
        head = "\n".join(lines[:end]).rstrip() + "\n"
        try:
            tree = ast.parse(head)
        except (SyntaxError, ValueError):
            continue
        return (head, tree) if any(isinstance(top, _DEFINITIONS) for top in tree.body) else None
    return None


def definitions(program: str) -> str:
    """The program's imports, functions and classes, and the module-level names they read; its other top-level
    statements (the model's own demo: prints, asserts of what it expects, calls) dropped, as EvalPlus's
    sanitizer does: an answer whose function is right but whose own example assert is wrong passes, as graded
    there. A program that does not parse is cut to its longest head of whole lines that does when only its
    top-level demo is cut (EvalPlus's sanitizer keeps the longest valid code): an answer whose demo ran into
    max_tokens mid-line keeps the functions written before it. Else it is returned as it is (its syntax error is
    the grade)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError):
        head = _parsable_head(program)
        if head is None:
            return program
        program, tree = head
    used = {n.id for top in tree.body if isinstance(top, _DEFINITIONS) for n in ast.walk(top)
            if isinstance(n, ast.Name)}

    def kept(top: ast.stmt) -> bool:
        if isinstance(top, _DEFINITIONS):
            return True
        if isinstance(top, (ast.Assign, ast.AnnAssign)):  # a constant or a table a definition reads
            targets = top.targets if isinstance(top, ast.Assign) else [top.target]
            return any(isinstance(n, ast.Name) and n.id in used for t in targets for n in ast.walk(t))
        return False

    keep = [top for top in tree.body if kept(top)]
    if len(keep) == len(tree.body):
        return program
    lines = program.splitlines()
    spans = [(min([top.lineno] + [d.lineno for d in getattr(top, "decorator_list", [])]),
              top.end_lineno or top.lineno) for top in keep]
    return "\n".join("\n".join(lines[a - 1 : b]) for a, b in spans) + "\n"


def extract_program(answer: str, task: CodeTask) -> str | None:
    """The program to test: the prompt and the answer's code (see the module docstring), its top-level demo
    statements dropped (`definitions`); None: no code."""
    code = extract_code(answer, task.entry_point)
    if code is None:
        return None
    if _defines(code, task.entry_point) or not code[:1].isspace():
        return definitions(f"{task.prompt.rstrip()}\n\n\n{code}")
    return definitions(task.prompt + code)  # a body continuing the prompt's signature and docstring


# --- the child process -------------------------------------------------------------------------------------

# Runs in the sandbox: argv = [entry point]; the solution in solution.py, the tests in tests.py (cwd).
_HARNESS = r'''
import os, sys, traceback
def _line(path, tb):
    frames = [f for f in traceback.extract_tb(tb) if f.filename == path]
    return (frames[-1].line or "").strip() if frames else ""
def _where(tb):
    test, last = _line("tests.py", tb), _line("solution.py", tb)
    return " at " + ", ".join(f"`{x}`" for x in (last, test) if x) if test or last else ""
def _done(code, text):
    sys.stdout.flush()
    sys.stderr.write("\n@@specledger@@" + text[:2000])
    sys.stderr.flush()
    os._exit(code)
entry = sys.argv[1]
sources = {p: open(p, encoding="utf-8").read() for p in ("solution.py", "tests.py")}
ns = {"__name__": "solution", "__builtins__": __builtins__}
stage = "solution.py"
try:
    solution = compile(sources["solution.py"], "solution.py", "exec")
    tests = compile(sources["tests.py"], "tests.py", "exec")
    exec(solution, ns)
    stage = "tests.py"
    exec(tests, ns)
    if entry not in ns:
        _done(11, f"NameError: the answer defines no {entry}()")
    ns["check"](ns[entry])
except SyntaxError as e:
    _done(12, f"SyntaxError in {e.filename}: {e.msg} (line {e.lineno})")
except AssertionError as e:
    _done(10, f"AssertionError{': ' + str(e)[:300] if str(e) else ''}{_where(e.__traceback__)}")
except SystemExit as e:
    _done(11, f"SystemExit({e.code!r}) in {stage}")
except BaseException as e:
    _done(11, f"{type(e).__name__}: {str(e)[:300]}{_where(e.__traceback__)}")
_done(0, "passed")
'''
_MARK = "@@specledger@@"
_CODES: dict[int, Outcome] = {0: "passed", 10: "failed", 11: "error", 12: "error"}


@functools.lru_cache(maxsize=1)
def _isolation() -> tuple[list[str], bool]:
    """(the command prefix for namespaces, whether the uid can be switched): what this machine allows."""
    prefix: list[str] = []
    unshare = shutil.which("unshare")
    if unshare:
        cmd = [unshare, "-n", "-p", "-f", "--kill-child"]
        try:
            if subprocess.run([*cmd, "true"], capture_output=True, timeout=10).returncode == 0:
                prefix = cmd
        except (OSError, subprocess.SubprocessError):
            pass
    return prefix, hasattr(os, "geteuid") and os.geteuid() == 0


def sandbox_description() -> str:
    """What the sandbox gives on this machine, in words (the run notes it)."""
    prefix, switch = _isolation()
    parts = ["own temporary directory", "stdin closed", "stdout/stderr capped", "CPU, memory and process limits",
             "process group killed at the timeout"]
    parts.append("no network (network and PID namespaces)" if prefix else "network NOT isolated (unshare unavailable)")
    parts.append("an unprivileged uid per slot" if switch else "runs as the calling user")
    return "; ".join(parts)


def _limit(limits: Limits):
    """The child's limits, set between fork and exec (they hold for unshare and setpriv, and are inherited)."""
    def apply() -> None:
        for which, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_bytes),
                             (resource.RLIMIT_FSIZE, limits.output_bytes), (resource.RLIMIT_CORE, 0),
                             (resource.RLIMIT_NPROC, limits.processes)):
            resource.setrlimit(which, (value, value))
    return apply


def _command(entry_point: str, uid: int | None) -> list[str]:
    """The namespaces need root to be made: they are entered first, then the privileges dropped (setpriv)."""
    prefix, _ = _isolation()
    drop = [] if uid is None else [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}",
                                   "--clear-groups"]
    return [*prefix, *drop, sys.executable, "-I", "-B", "-c", _HARNESS, entry_point]


def _tail(path: Path, n: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _owned_by(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except OSError:
                continue
    return pids


def _reap(uid: int, within_s: float = 5.0) -> None:
    """Kill whatever still runs as the slot's uid (a namespace's members die asynchronously; without
    namespaces, a child that left the process group) and wait until none is left, so the slot is clean."""
    deadline = time.monotonic() + within_s
    while (pids := _owned_by(uid)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


_SLOTS: queue.LifoQueue[int] = queue.LifoQueue()
for _k in range(MAX_SLOTS):
    _SLOTS.put(_k)


def run_tests(program: str, task: CodeTask, limits: Limits = Limits()) -> ExecResult:
    """Run the program and the task's tests in the sandbox (see the module docstring) and say how it went.
    Thread-safe: each concurrent run takes a slot (its own uid) and gives it back."""
    slot = _SLOTS.get()
    try:
        return _run(program, task, limits, slot)
    finally:
        _SLOTS.put(slot)


def _run(program: str, task: CodeTask, limits: Limits, slot: int) -> ExecResult:
    _, switch = _isolation()
    uid = SLOT_UID_BASE + slot if switch and shutil.which("setpriv") else None
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specledger-exec-") as tmp:
        work = Path(tmp)
        (work / "solution.py").write_text(program, encoding="utf-8")
        (work / "tests.py").write_text(task.tests, encoding="utf-8")
        if uid is not None:
            os.chown(work, uid, uid)
        out, err = work / "stdout", work / "stderr"
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(_command(task.entry_point, uid), cwd=work, stdin=subprocess.DEVNULL,
                                    stdout=fo, stderr=fe, start_new_session=True, preexec_fn=_limit(limits),
                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
                                         "PYTHONDONTWRITEBYTECODE": "1", "HOME": tmp})
            try:
                code = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                if uid is not None:
                    _reap(uid)
                return ExecResult("timeout", f"killed after {limits.timeout_s:g} s (wall clock)",
                                  time.perf_counter() - t0)
            finally:
                if proc.returncode is None:
                    _kill_group(proc)
            _kill_group(proc)  # anything it left running in its group
            if uid is not None:
                _reap(uid)
        seconds = time.perf_counter() - t0
        tail = _tail(err, 4096)
    said = tail.rsplit(_MARK, 1)[1].strip() if _MARK in tail else ""
    if code in _CODES and said:
        return ExecResult(_CODES[code], said[:MESSAGE_CHARS], seconds)
    return ExecResult("error", _died(code, limits, tail), seconds)


def _died(code: int, limits: Limits, stderr_tail: str) -> str:
    """Why a child ended without the harness's last word: a signal, a limit, a crash."""
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    why: dict[int, str] = {signal.SIGXCPU: f"CPU time over {limits.cpu_s} s", signal.SIGKILL: "killed (CPU or memory limit)",
           signal.SIGXFSZ: f"output over {limits.output_bytes:,} bytes", signal.SIGSEGV: "segmentation fault"}
    if sig and sig in why:
        return why[sig]
    last = [x for x in stderr_tail.splitlines() if x.strip()][-1:] or [f"exit status {code}"]
    return f"ended without finishing the tests ({last[0].strip()[:300]})"


def grade_program(answer: str, task: CodeTask, limits: Limits = Limits()) -> ExecResult:
    """Extract and run: `error` with "nothing extracted" when the answer holds no code."""
    program = extract_program(answer, task)
    if program is None:
        return ExecResult("error", "nothing extracted: the answer holds no code")
    return run_tests(program, task, limits)


def default_workers() -> int:
    """Runs at once: each waits on its process's start far more than it computes (~25 ms of CPU in ~150 ms), so
    four per core (8 on 2 cores: 18-27 items/s, against 8-15 at 2 and 4; benchmarks/grading_throughput.py)."""
    return max(4, 4 * (os.cpu_count() or 1))


def grade_many(items: Iterable[tuple[str, CodeTask]], limits: Limits = Limits(),
               workers: int | None = None) -> Iterator[ExecResult]:
    """Grade (answer, task) pairs `workers` at a time (each in its own process); results in the input's order."""
    with ThreadPoolExecutor(max_workers=workers or default_workers(), thread_name_prefix="specledger-exec") as pool:
        yield from pool.map(lambda pair: grade_program(pair[0], pair[1], limits), items)

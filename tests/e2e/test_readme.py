"""Every `specledger` command line in README.md works as written, so the README cannot drift from the program.

Each line of a fenced code block that starts with `specledger` (several per line when joined by ` ; `; a `[...]`
group is tried both left out and put in) is handled by the rule for its subcommand, below; a subcommand
with no rule fails the test. Commands run in-process, in a temporary directory, with loaded models shared
between commands (the same weights every time; loading is what would make this slow). Inline
`specledger ...` spans in the prose are parsed against the program's options (not run).
"""

from __future__ import annotations

import inspect
import re
import shlex
import shutil
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

README = Path(__file__).resolve().parents[2] / "README.md"
PROMPT = "Why is the sky blue?"  # in place of the README's "..."
SHORT_TEXT = "The library opens at eight. " * 12  # `quality` reads this instead of its built-in text

# How each subcommand's README lines are exercised. "run": as written, plus `extra` arguments that only make
# it short; "parse": every option is checked against the program (its values parsed) but it is not run,
# for the reason given.
RUN_EXTRA = {
    "models": [],
    "generate": ["-n", "4"],
    "quality": ["--text", "short.txt"],
    "cost": [],  # `cost --init FILE` and `cost RUN_DIR` are quick
    "show": [],
    "diff": [],
    "report": ["--samples", "50"],
    "bench": ["--workload", "builtin-quick", "--limit", "1", "--max-tokens", "4", "--warmup", "0",
              "--no-progress"],  # a later --workload wins: one question of the quick workload
}
PARSE_ONLY = {
    "train-draft": "generates data and trains for minutes",
    "compare": "runs the whole default matrix (minutes)",
    "serve": "serves until stopped",
    "import": "needs a result file written by another tool (tests/bench/test_import_*.py run the importers)",
}
RUN_PLACEHOLDERS = ("id", "a", "b")  # runs/<id>, runs/<a>, runs/<b>: the short bench run (and a copy)
FAST = {"models", "cost"}  # no model loading: not marked slow (when they need no run directory)


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def _commands(line: str) -> list[str]:
    line = line.split(" #", 1)[0] if " #" in line else line
    return [c.strip() for c in line.split(" ; ") if c.strip().startswith("specledger")]


def fenced_command_lines(text: str) -> list[str]:
    """`specledger ...` commands in fenced code blocks, comments dropped, ` ; `-joined ones split."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.lstrip().startswith("specledger"):
            out += _commands(line.strip())
    return out


def inline_commands(text: str) -> list[str]:
    """`specledger ...` spans in the prose (outside fenced blocks)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [m.strip() for m in re.findall(r"`(specledger [^`]+)`", prose)]


def variants(command: str) -> list[str]:
    """The command with every [...] group left out, then with each group put in, one at a time."""
    n = len(re.findall(r"\[[^\]]*\]", command))

    def keep(i: int) -> str:
        count = iter(range(n))
        return re.sub(r"\s*\[([^\]]*)\]", lambda m: f" {m.group(1)}" if next(count) == i else "", command)

    return [keep(i) for i in range(-1, n)]


def argv(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "specledger", command
    return words[1:]


def plan() -> list[tuple[str, str]]:
    """(command, how) for every fenced README command; how is 'run', 'parse' or 'unlisted'."""
    out = []
    for command in fenced_command_lines(readme_text()):
        for v in variants(command):
            sub = argv(v)[0]
            out.append((v, "run" if sub in RUN_EXTRA else "parse" if sub in PARSE_ONLY else "unlisted"))
    return out


def _marks(command: str, how: str) -> list:
    sub = argv(command)[0]
    fast = how != "run" or (sub in FAST and "runs/<" not in command)
    return [] if fast else [pytest.mark.slow]


PLAN = plan()


# --- the extraction itself ------------------------------------------------------------------------


def test_extraction():
    text = """
```sh
make demo   # runs `specledger compare`
specledger show runs/<id> ; specledger diff runs/<a> runs/<b>
specledger cost runs/<id> [--inputs cost.yaml] ; specledger cost --init cost.yaml
specledger generate "..." -p k=1   # a comment
```
See `specledger serve --port 1 [--max-queue 2]` and `pip install 'specledger[x]'`.
"""
    assert fenced_command_lines(text) == [
        "specledger show runs/<id>", "specledger diff runs/<a> runs/<b>",
        "specledger cost runs/<id> [--inputs cost.yaml]", "specledger cost --init cost.yaml",
        'specledger generate "..." -p k=1',
    ]
    assert inline_commands(text) == ["specledger serve --port 1 [--max-queue 2]"]
    assert variants("specledger cost R [--inputs c.yaml] [--json o.json]") == [
        "specledger cost R", "specledger cost R --inputs c.yaml", "specledger cost R --json o.json"]
    assert argv('specledger generate "..." -p k=1') == ["generate", "...", "-p", "k=1"]


def test_every_readme_command_is_planned():
    assert len(PLAN) >= 15, "README commands not found (extraction broken?)"
    unlisted = [c for c, how in PLAN if how == "unlisted"]
    assert not unlisted, f"README commands with no rule in tests/e2e/test_readme.py (add one): {unlisted}"
    subs = {argv(c)[0] for c, _ in PLAN}
    for sub in ("models", "generate", "quality", "bench", "cost", "report", "compare", "serve"):
        assert sub in subs, f"the README no longer shows `specledger {sub}`"


# --- running them ---------------------------------------------------------------------------------


def _app() -> typer.Typer:
    from specledger.cli import app

    return app


def invoke(args: list[str]) -> str:
    """Run one command in-process; a SpecLedgerError or any other exception fails with its message."""
    from specledger.errors import SpecLedgerError

    result = CliRunner().invoke(_app(), args)
    exc = result.exception
    if isinstance(exc, SpecLedgerError):
        pytest.fail(f"specledger {shlex.join(args)}: error: {exc}")
    if exc is not None and not isinstance(exc, SystemExit):
        raise exc
    assert result.exit_code == 0, f"specledger {shlex.join(args)} exited {result.exit_code}:\n{result.output}"
    return result.output


def parse(args: list[str]) -> None:
    """Resolve the subcommand and parse its options and arguments without running it."""
    cli = typer.main.get_command(_app())
    sub = cli.get_command(click.Context(cli), args[0])
    assert sub is not None, f"no command `specledger {args[0]}`"
    try:
        sub.make_context(args[0], list(args[1:]), resilient_parsing=False)
    except click.exceptions.Exit:
        pass
    except click.UsageError as exc:
        pytest.fail(f"specledger {shlex.join(args)}: {exc.format_message()}")


@pytest.fixture(scope="module")
def shared_models():
    """Every load_model call with the same arguments returns the same LoadedModel (read-only weights)."""
    import sys

    from specledger.engine import loader

    real = loader.load_model
    sig = inspect.signature(real)
    cache: dict = {}

    def load_model(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        a["dtype"] = a["dtype"] or loader.default_dtype(a["quant"])
        key = tuple(sorted((k, str(v)) for k, v in a.items()))
        if key not in cache:
            cache[key] = real(**a)
        return cache[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loader, "load_model", load_model)
        for mod in list(sys.modules.values()):
            if (mod.__name__ or "").startswith("specledger") and getattr(mod, "load_model", None) is real:
                mp.setattr(mod, "load_model", load_model)
        yield cache


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory, shared_models) -> dict[str, Path]:
    """The README's own `specledger bench` line, made short: the run directory the other lines read."""
    bench = [c for c, how in PLAN if how == "run" and argv(c)[0] == "bench"]
    assert bench, "the README shows no `specledger bench` line to produce a run directory"
    out = tmp_path_factory.mktemp("runs")
    invoke(argv(bench[0]) + RUN_EXTRA["bench"] + ["--output-dir", str(out), "--run-id", "a"])
    shutil.copytree(out / "a", out / "b")
    return dict(zip(RUN_PLACEHOLDERS, (out / "a", out / "a", out / "b")))


def substitute(args: list[str], run_dirs: dict[str, Path] | None) -> list[str]:
    out = []
    for a in args:
        if a == "...":
            a = PROMPT
        m = re.fullmatch(r"runs/<(\w+)>/?", a)
        if m:
            assert run_dirs is not None and m.group(1) in run_dirs, f"unknown run placeholder {a}"
            a = str(run_dirs[m.group(1)])
        assert "<" not in a and ">" not in a, f"placeholder {a!r} has no substitute in tests/e2e/test_readme.py"
        out.append(a)
    return out


@pytest.mark.parametrize(
    "command", [pytest.param(c, id=c, marks=_marks(c, how)) for c, how in PLAN if how == "run"])
def test_readme_command_runs(command, request, tmp_path, monkeypatch, shared_models):
    args = argv(command)
    sub = args[0]
    substitute(args, {k: Path() for k in RUN_PLACEHOLDERS})  # an unknown placeholder fails before any run
    dirs = request.getfixturevalue("run_dirs") if "runs/<" in command else None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "short.txt").write_text(SHORT_TEXT)
    if sub == "bench":  # the run_dirs fixture ran it (short)
        assert (request.getfixturevalue("run_dirs")["id"] / "run.json").exists()
        return
    args = substitute(args, dirs)
    if "./my-llama" in args:  # the README's own Hugging Face directory: a tiny one saved by transformers
        from tests.engine.test_hf_conformance import save_model, save_tokenizer

        save_model(tmp_path / "my-llama")
        save_tokenizer(tmp_path / "my-llama")
    if "--inputs" in args:  # the cost file the README writes with `cost --init`
        invoke(["cost", "--init", args[args.index("--inputs") + 1]])
    out = invoke(args + RUN_EXTRA[sub])
    if sub == "generate":
        assert "tau" in out or "steps" in out
    if sub == "cost" and "--init" in args:
        assert (tmp_path / args[args.index("--init") + 1]).exists()


@pytest.mark.parametrize("command", [c for c, how in PLAN if how == "parse"])
def test_readme_long_command_parses(command):
    args = substitute(argv(command), {k: Path(f"runs/{k}") for k in RUN_PLACEHOLDERS})
    parse(args)


@pytest.mark.parametrize("command", sorted({v for c in inline_commands(readme_text()) for v in variants(c)}))
def test_readme_inline_command_parses(command):
    args = argv(command)
    if len(args) == 1:  # a bare command name in the prose
        cli = typer.main.get_command(_app())
        assert cli.get_command(click.Context(cli), args[0]) is not None, f"no command `specledger {args[0]}`"
        return
    parse(substitute(args, {k: Path(f"runs/{k}") for k in RUN_PLACEHOLDERS}))

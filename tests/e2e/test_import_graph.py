"""The package's shape, read from the source with `ast` (nothing is imported):

- no import cycle among specledger's modules, counting every import statement wherever it is: at the top of a
  module, inside a function (a lazy import is still an arrow), under `if TYPE_CHECKING:`;
- the CLI sits on top: nothing outside specledger/cli imports specledger.cli;
- the run's records (specledger/records) are the floor the readers stand on: records, quality, the ledger and the
  report never import the harness (specledger/bench), and records imports no torch;
- no class over MAX_CLASS_LINES lines (ALLOWED_BIG_CLASSES names the exceptions still being split).

An import `from a.b import c` is an arrow to the module a.b.c when there is one, else to a.b. A package's
`__init__` is a module like any other; importing a.b.c is not counted as an arrow to a.b (Python runs a.b's
`__init__` first, but an `__init__` that imports its own submodules would otherwise be a cycle by definition).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "specledger"
CLI = "specledger.cli"
MAX_CLASS_LINES = 250
# (module, class): being split by its own change; remove the entry when it is (the test says when).
ALLOWED_BIG_CLASSES: set[tuple[str, str]] = set()


def module_files(src: Path = SRC, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is it a package's __init__)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest known module that `name` starts with (a.b.func -> a.b)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, source: str, is_pkg: bool, known: set[str]) -> dict[str, int]:
    """Known modules imported anywhere in `source` -> the first line importing each."""
    package = module if is_pkg else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                found.setdefault(target, node.lineno)
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    files = module_files(src, package)
    known = set(files)
    return {m: imports_of(m, p.read_text(encoding="utf-8"), is_pkg, known) for m, (p, is_pkg) in files.items()}


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Depth-first search; iterative, so deep graphs are fine."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, {}))))
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50, "modules not found (SRC wrong?)"
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {_describe(cycle, graph)}"


def test_areas_never_import_the_cli():
    graph = import_graph()
    assert CLI in graph and any(t.startswith(CLI + ".") for t in graph[CLI]), "the cli package is not where expected"
    offenders = [f"{m} (line {line})" for m, targets in graph.items() if not (m == CLI or m.startswith(CLI + "."))
                 for t, line in targets.items() if t == CLI or t.startswith(CLI + ".")]
    assert not offenders, f"imports of the CLI from below it: {offenders}"


# Areas that read a run and must not reach back into the harness that writes it.
READERS = ("specledger.records", "specledger.quality", "specledger.ledger", "specledger.report")
HARNESS = "specledger.bench"


def _in(module: str, area: str) -> bool:
    return module == area or module.startswith(area + ".")


def test_readers_never_import_the_harness():
    graph = import_graph()
    assert any(_in(m, "specledger.records") for m in graph), "the records package is not where expected"
    offenders = [f"{m} -> {t} (line {line})" for m, targets in graph.items() if any(_in(m, r) for r in READERS)
                 for t, line in targets.items() if _in(t, HARNESS)]
    assert not offenders, f"arrows back up into the harness: {offenders}"


def test_records_import_no_torch():
    """The schema is read by the ledger and the report on machines with no engine: a subprocess imports every
    records module and finds torch not loaded."""
    import subprocess
    import sys

    mods = sorted(m for m in module_files() if _in(m, "specledger.records"))
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False", f"importing {mods} loads torch"


def class_sizes(src: Path = SRC, package: str = PACKAGE) -> dict[tuple[str, str], int]:
    out = {}
    for module, (path, _) in module_files(src, package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                out[(module, node.name)] = node.end_lineno - start + 1
    return out


def test_no_class_over_the_limit():
    sizes = class_sizes()
    assert len(sizes) > 50
    big = {k: n for k, n in sizes.items() if n > MAX_CLASS_LINES and k not in ALLOWED_BIG_CLASSES}
    assert not big, f"classes over {MAX_CLASS_LINES} lines (split them): {big}"
    stale = [k for k in ALLOWED_BIG_CLASSES if sizes.get(k, 0) <= MAX_CLASS_LINES]
    assert not stale, f"no longer over {MAX_CLASS_LINES} lines, take them off ALLOWED_BIG_CLASSES: {stale}"


# The checks themselves can fail: a small package on disk with a cycle made only of function-level imports,
# a relative import, and an import of the CLI from an area.

def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_lazy_cycle_is_found(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from pkg.b import g\n    return g\n",
        "pkg/b.py": "def g():\n    from . import c\n    return c\n",
        "pkg/c.py": "import os\n\n\ndef h():\n    import pkg.a\n    return pkg.a.f, os\n",
        "pkg/d.py": "from pkg.a import f\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.b": 2} and graph["pkg.b"] == {"pkg.c": 2} and graph["pkg.c"] == {"pkg.a": 5}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (tmp_path / "pkg/c.py").write_text("import os\n", encoding="utf-8")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None


def test_find_cycle_on_graphs():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None
    assert find_cycle({"a": {"b": 1, "c": 1}, "b": {"c": 1}, "c": {}}) is None  # a diamond is not a cycle
    assert find_cycle({"a": {"b": 1}, "b": {"a": 1}}) == ["a", "b", "a"]
    assert find_cycle({"x": {}, "a": {"b": 1}, "b": {"c": 1}, "c": {"b": 1}}) == ["b", "c", "b"]


def test_class_sizes_counted(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/big.py": f"@dec\nclass Big:\n{body}\n\n\nclass Small:\n    y = 1\n"})
    sizes = class_sizes(tmp_path, "pkg")
    assert sizes == {("pkg.big", "Big"): MAX_CLASS_LINES + 2, ("pkg.big", "Small"): 2}

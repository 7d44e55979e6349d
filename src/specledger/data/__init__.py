"""Files shipped with the package (read through importlib.resources, so they are found in a wheel too)."""

from __future__ import annotations

from importlib import resources


def quality_text() -> str:
    """The built-in mixed-domain text that quantization agreement and model conformance read."""
    return resources.files("specledger.data").joinpath("quality_text.txt").read_text()

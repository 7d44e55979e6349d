"""A model file that is not whole or not well typed is one line naming it, exit 2, never a traceback (issue 56)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specledger.errors import BadInput, UnsupportedModel


def _embedded():
    from specledger.engine.registry import resolve_model

    try:
        return resolve_model("smollm2-135m")
    except Exception as exc:  # model package not installed
        pytest.skip(f"embedded model unavailable: {exc}")


@pytest.mark.parametrize("keep", [100, 1_000_000, 0.5])
def test_a_truncated_gguf_is_one_line(tmp_path, keep):
    """Cut in its header, in its metadata, or in its tensor data (that one used to read on, then fail in a reshape
    deep inside the tokenizer's or the loader's read)."""
    from specledger.engine.loader import read_model_config

    src = _embedded()
    n = int(src.stat().st_size * keep) if isinstance(keep, float) else keep
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(n))
    with pytest.raises(BadInput, match=rf"{cut} is not a readable GGUF file") as info:
        read_model_config(str(cut))
    assert "\n" not in str(info.value)
    if isinstance(keep, float):
        assert f"truncated: {n:,} bytes, its tensors end at byte {src.stat().st_size:,}" in str(info.value)


def test_a_truncated_gguf_on_the_command_line_is_exit_2(tmp_path):
    src = _embedded()
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(src.stat().st_size // 2))
    r = subprocess.run([sys.executable, "-m", "specledger.cli", "generate", "--model", str(cut), "hi"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: {cut} is not a readable GGUF file (truncated")


@pytest.mark.parametrize("edit,needle", [
    ({"hidden_size": "64"}, "Field 'hidden_size' expected int, got str"),
    ({"eos_token_id": "2"}, "Field 'eos_token_id' with value '2'"),
    ({"max_position_embeddings": True}, "Field 'max_position_embeddings' expected int, got bool"),
])
def test_a_config_json_field_of_the_wrong_type_is_one_line(tmp_path, edit, needle):
    from specledger.engine.loader import read_model_config
    from tests.engine.test_hf_conformance import save_model

    d = save_model(tmp_path / "m", edit=edit)
    with pytest.raises(UnsupportedModel) as info:
        read_model_config(str(d))
    msg = str(info.value)
    assert msg.startswith(f"{d / 'config.json'}: transformers cannot read it") and needle in msg and "\n" not in msg

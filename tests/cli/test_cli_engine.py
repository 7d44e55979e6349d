"""Bad input at the command line: one clear line on stderr, exit 2, no traceback."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "specledger.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["generate", "hi", "--model", "/nope/model.gguf"], "no model '/nope/model.gguf'"),
        (["generate", "hi", "--quant", "int3"], "unknown quantization 'int3'"),
        (["generate", "hi", "--dtype", "fp8"], "unknown dtype 'fp8'"),
        (["generate", "hi", "--quant", "int4", "--group-size", "48"], "group size 48"),
        (["generate", "   "], "empty prompt"),
        (["generate", "hi", "--strategy", "medusa"], "unknown strategy 'medusa'"),
        (["generate", "hi", "-p", "oops"], "not key=value"),
    ],
)
def test_bad_input_is_one_line(args, needle):
    r = run(*args)
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    r = run("generate", "hi", "--model", str(bad))
    assert r.returncode == 2 and "not a readable GGUF file" in r.stderr and "Traceback" not in r.stderr


def test_unsupported_architecture(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    r = run("generate", "hi", "--model", str(d))
    assert r.returncode == 2 and "model_type='gpt2' (GPT2LMHeadModel) is not supported" in r.stderr

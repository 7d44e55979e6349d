"""One model, one identity: its registry name, whether it is given by name, by path or as 'target'."""

from __future__ import annotations

import os

import pytest

from tests.conftest import tiny_model
from specledger.records.config import BenchConfig
from specledger.decoding import factory
from specledger.engine.pool import ModelPool
from specledger.engine.registry import identify_model, model_key, resolve_model
from specledger.errors import ModelNotFound


@pytest.fixture(scope="module")
def gguf():
    return resolve_model("smollm2-135m")


def test_registry_file_by_path_is_the_registry_model(gguf, tmp_path, monkeypatch):
    by_name = identify_model("smollm2-135m")
    assert by_name.name == "smollm2-135m" and by_name.path == gguf
    assert identify_model(str(gguf)) == by_name
    link = tmp_path / "elsewhere.gguf"
    os.symlink(gguf, link)
    assert identify_model(str(link)) == by_name  # a link to the same file is the same model
    monkeypatch.chdir(gguf.parent)
    assert identify_model(gguf.name) == by_name  # a relative path too
    assert model_key("smollm2-135m") == model_key(str(link)) == str(gguf)


def test_other_files_keep_their_own_names(tmp_path):
    other = tmp_path / "Mine.Q8_0.gguf"
    other.write_bytes(b"x")
    assert identify_model(str(other)).name == "Mine.Q8_0"
    d = tmp_path / "hf-model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert identify_model(str(d)).name == "hf-model" and identify_model(str(d) + "/").name == "hf-model"
    with pytest.raises(ModelNotFound, match="no model 'nope'"):
        identify_model("nope")
    assert model_key("nope") == "nope"


def _target(gguf):
    lm = tiny_model()
    lm.source, lm.name = str(gguf), "smollm2-135m"
    return lm


def test_model_parameters_share_one_load_per_identity(gguf, monkeypatch):
    calls = []
    monkeypatch.setattr(factory, "POOL", ModelPool())
    monkeypatch.setattr(factory, "load_model", lambda model, **kw: calls.append((model, kw)) or object())
    target = _target(gguf)
    # the target's own identity and precision, however named, is the target itself
    for value in ("target", "self", "smollm2-135m", str(gguf), {"model": "target", "dtype": "fp32"}):
        assert factory.resolve_model(value, target) is target
    a = factory.resolve_model({"model": "target", "quant": "int4"}, target)
    b = factory.resolve_model({"model": "smollm2-135m", "quant": "int4", "dtype": "bf16", "group_size": 32}, target)
    c = factory.resolve_model({"model": str(gguf), "quant": "int4", "group_size": 64}, target)
    assert a is b and c is not a and len(calls) == 2
    assert calls[0][1]["dtype"] == "bf16"


def test_run_configuration_target_alias():
    c = BenchConfig(name="d", strategy="draft", model="smollm2-135m", draft={"model": "target", "quant": "int4"})
    assert c.draft.model == "smollm2-135m"
    c = BenchConfig(name="h", strategy="hier", model="/m.gguf", intermediate={"model": "self", "dtype": "bf16"})
    assert c.intermediate.model == "/m.gguf"

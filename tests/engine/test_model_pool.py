"""The model pool: every loaded model and what is derived from one, under one eviction rule (retain)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import tiny_model
from specledger.records.config import parse_run_config
from specledger.bench.shared_models import SharedModels
from specledger.engine.pool import ModelPool, key_of, model_pool_key


def test_retain_drops_other_models_with_what_was_derived_from_them():
    pool = ModelPool()
    a, b = ("a",), ("b",)
    pool.put(a, "model a")
    pool.put(b, "model b")
    calls = []
    assert pool.derived(a, "curve", lambda: calls.append("a") or [1]) == [1]
    assert pool.derived(a, "curve", lambda: calls.append("a") or [2]) == [1]  # computed once
    pool.derived(b, "curve", lambda: calls.append("b") or [3])
    pool.retain([a])
    assert a in pool and b not in pool and pool.get(b) is None
    assert pool.derived(a, "curve", lambda: [9]) == [1]  # kept with its model
    assert pool.derived(b, "curve", lambda: [4]) == [4]  # went with its model: made again
    assert calls == ["a", "b"]
    pool.retain(())
    assert pool.keys() == set()


def test_a_derived_value_belongs_to_the_object_it_came_from():
    """Same key, other weights (e.g. two random test models): the value is made again, not reused."""
    pool = ModelPool()
    w1, w2 = tiny_model(seed=1).model, tiny_model(seed=2).model
    first = pool.derived(("k",), "head", lambda: "from w1", owner=w1)
    assert pool.derived(("k",), "head", lambda: "again", owner=w1) == first
    assert pool.derived(("k",), "head", lambda: "from w2", owner=w2) == "from w2"


def test_load_loads_once_per_key():
    pool = ModelPool()
    loads = []
    for _ in range(3):
        pool.load(("m",), lambda: loads.append(1) or object())
    assert len(loads) == 1


def test_eagle_lm_head_lives_in_the_pool(monkeypatch):
    import torch

    from specledger.decoding.drafters import eagle
    from specledger.decoding.drafters.eagle_head import EagleHead, HeadConfig

    pool = ModelPool()
    monkeypatch.setattr(eagle, "POOL", pool)
    lm = tiny_model()
    head = EagleHead(HeadConfig.for_target(lm), draft_vocab=torch.arange(16)).eval().requires_grad_(False)
    h1 = eagle.pooled_lm_head(head, lm)
    again = EagleHead(HeadConfig.for_target(lm), draft_vocab=torch.arange(16)).eval().requires_grad_(False)
    assert eagle.pooled_lm_head(again, lm) is h1  # same vocabulary and dtype: shared
    pool.retain([key_of(lm)])
    assert eagle.pooled_lm_head(head, lm) is h1
    pool.retain(())
    h2 = eagle.pooled_lm_head(head, lm)
    assert h2 is not h1  # evicted with its model: made again
    assert eagle.pooled_lm_head(head, tiny_model(seed=5)) is not h2  # other weights under the same key


def test_factory_loads_model_parameters_through_the_pool(monkeypatch):
    from specledger.decoding import factory

    pool = ModelPool()
    monkeypatch.setattr(factory, "POOL", pool)
    loads = []
    monkeypatch.setattr(factory, "load_model", lambda model, **kw: loads.append(model) or object())
    target = tiny_model()
    a = factory.resolve_model({"model": "other.gguf", "quant": "int8"}, target)
    assert factory.resolve_model({"model": "other.gguf", "quant": "int8"}, target) is a
    pool.retain(())
    assert factory.resolve_model({"model": "other.gguf", "quant": "int8"}, target) is not a
    assert len(loads) == 2


def test_a_run_keeps_a_model_while_a_later_configuration_needs_it():
    cfg = parse_run_config({"configs": [
        {"name": "a", "model": "m1.gguf"}, {"name": "b", "model": "m2.gguf"}, {"name": "c", "model": "m1.gguf"},
        {"name": "d", "model": "m3.gguf"}]})
    a, b, c, d = cfg.configs
    pool = ModelPool()
    outside = pool.put(("the caller's",), object())
    shared = SharedModels(cfg, pool)
    assert shared.for_config(a) == {}
    m1 = object()
    shared.keep(a, {"target": m1})
    assert shared.for_config(b) == {}
    shared.keep(b, {"target": object()})
    assert shared.for_config(c) == {"target": m1}  # a's weights, shared; b's kept until c starts
    assert model_pool_key("m2.gguf", "fp32", "none", 32, "cpu") not in pool
    shared.for_config(d)
    assert model_pool_key("m1.gguf", "fp32", "none", 32, "cpu") not in pool
    shared.keep(d, {"target": object()})
    shared.release()
    assert pool.keys() == {("the caller's",)} and pool.get(("the caller's",)) is outside


@pytest.mark.parametrize("quant,group", [("int4", 64), ("int8", None)])
def test_keys_name_weights_not_names(quant, group):
    lm = tiny_model(quant=quant, group_size=group or 32)
    assert key_of(lm)[2:4] == (quant, group)


def test_a_w4a8_arm_after_a_w4a16_arm_of_the_same_file_gets_its_own_model():
    """The activation precision is part of a model's key: in one run, a W4A8 arm after a W4A16 arm of the same
    file must not be handed the W4A16 model (it would silently measure W4A16 under the W4A8 name)."""
    cfg = parse_run_config({"configs": [
        {"name": "w4a16", "model": "m1.gguf", "dtype": "bf16", "quant": "int4"},
        {"name": "w4a8", "model": "m1.gguf", "dtype": "bf16", "quant": "int4", "activations": 8},
        {"name": "w4a16-again", "model": "m1.gguf", "dtype": "bf16", "quant": "int4"}]})
    a16, a8, again = cfg.configs
    shared = SharedModels(cfg, ModelPool())
    w4a16 = tiny_model(dtype="bf16", quant="int4")
    shared.keep(a16, {"target": w4a16})
    # its own model: the same codes shared (loader.activation_twin), at 8 activation bits, never the W4A16 model
    twin = shared.for_config(a8)["target"]
    assert twin is not w4a16 and twin.model is not w4a16.model and twin.activations == 8
    shared.keep(a8, {"target": object()})
    assert shared.for_config(again) == {"target": w4a16}
    assert model_pool_key("m1.gguf", "bf16", "int4", 32, "cpu", 8) != model_pool_key("m1.gguf", "bf16", "int4", 32, "cpu")


def test_the_gates_reference_is_read_once_and_released_unless_an_arm_runs_it(monkeypatch):
    """read_references: one fp32 load per reference, however many quantized arms it checks; its weights leave the pool
    unless kept (an arm of the first group runs it); the agreement measured from the kept log-probabilities is the one
    measured from the model itself."""
    import specledger.engine.loader as loader
    from specledger.bench.probes import measure_agreement

    class Chars:  # a tokenizer for the 64-token test model: the quality text's characters
        def encode(self, text):
            return [ord(c) % 64 for c in text]

    fp32 = dataclasses.replace(tiny_model(), tokenizer=Chars())
    w4 = tiny_model(dtype="bf16", quant="int4")
    loads = []
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: loads.append(k) or fp32)
    cfg = parse_run_config({"configs": [
        {"name": "w4", "model": "m1.gguf", "dtype": "bf16", "quant": "int4"},
        {"name": "w4a8", "model": "m1.gguf", "dtype": "bf16", "quant": "int4", "activations": 8}]})
    shared = SharedModels(cfg, ModelPool())
    shared.read_references()
    ref = shared.reference_key(cfg.configs[0])
    assert len(loads) == 1 and loads[0]["dtype"] == "fp32" and ref not in shared.pool and ref in shared.references
    figures = shared.reference_figures(cfg.configs[1])
    assert len(loads) == 1 and figures is shared.references[ref]
    assert measure_agreement(figures, w4) == pytest.approx(measure_agreement(fp32, w4))
    kept = SharedModels(cfg, ModelPool())
    kept.read_references(keep={ref})
    assert kept.pool.get(ref) is fp32

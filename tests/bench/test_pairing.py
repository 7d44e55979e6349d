"""One rule pairs a configuration with its autoregressive baseline (records/pairing.py): the gates, the quality
source, the ledger's speed-ups and the tables all read it."""

from __future__ import annotations

from specledger.records.config import parse_run_config
from specledger.records.config import config_baselines, result_baselines
from specledger.records.pairing import speedup
from specledger.records.results import ConfigResult
from specledger.ledger.measurements import ConfigMeasurement
from specledger.ledger.price import speedups

LLAMA = "{llama_server} -m {model_path} --port {port}"


def _configs(*configs: dict):
    return parse_run_config({"configs": list(configs), "workload": {"spec": "builtin-quick"}}).configs


def _server(name: str, strategy: str, command: str = LLAMA, **server) -> dict:
    return {"name": name, "backend": "openai", "strategy": strategy, "openai": {"server": {"command": command, **server}}}


def test_the_same_target_at_another_precision_is_not_a_baseline():
    cs = _configs({"name": "ar-fp32", "strategy": "ar"},
                  {"name": "lookup-w4", "strategy": "lookup", "dtype": "bf16", "quant": "int4"},
                  {"name": "lookup-fp32", "strategy": "lookup"})
    assert config_baselines(cs) == {"ar-fp32": "ar-fp32", "lookup-fp32": "ar-fp32"}


def test_int8_activations_are_another_precision():
    """W4A8 speculation is measured against W4A8 decoding, in the plan and in run.json's records alike."""
    w4 = {"dtype": "bf16", "quant": "int4"}
    cs = _configs({"name": "ar-w4", "strategy": "ar", **w4}, {"name": "lookup-w4a8", "strategy": "lookup", **w4,
                                                               "activations": 8},
                  {"name": "ar-w4a8", "strategy": "ar", **w4, "activations": 8},
                  {"name": "lookup-w4", "strategy": "lookup", **w4})
    want = {"ar-w4": "ar-w4", "lookup-w4a8": "ar-w4a8", "ar-w4a8": "ar-w4a8", "lookup-w4": "ar-w4"}
    assert config_baselines(cs) == want
    results = [ConfigResult(name=c.name, backend=c.backend, model=c.model, strategy=c.strategy, dtype=c.dtype,
                            quant=c.quant, group_size=c.group_size, spec=c.model_dump(mode="json")) for c in cs]
    assert result_baselines(results) == want


def test_an_aa_twin_is_measured_against_its_elder():
    cs = _configs({"name": "ar-a", "strategy": "ar"}, {"name": "lookup", "strategy": "lookup"},
                  {"name": "ar-b", "strategy": "ar"})
    assert config_baselines(cs) == {"ar-a": "ar-a", "lookup": "ar-a", "ar-b": "ar-a"}


def test_a_run_without_an_autoregressive_configuration_has_no_baselines():
    cs = _configs({"name": "lookup", "strategy": "lookup"},
                  {"name": "draft", "strategy": "draft", "draft": {"model": "smollm2-135m"}})
    assert config_baselines(cs) == {}


def test_sampling_pairs_with_the_same_sampling():
    hot = {"temperature": 0.7, "top_p": 0.9}
    cs = _configs({"name": "ar", "strategy": "ar"}, {"name": "lookup-hot", "strategy": "lookup", "sampling": hot},
                  {"name": "ar-hot", "strategy": "ar", "sampling": {**hot, "seed": 5}},  # another seed: same sampling
                  {"name": "lookup", "strategy": "lookup"})
    assert config_baselines(cs) == {"ar": "ar", "lookup-hot": "ar-hot", "ar-hot": "ar-hot", "lookup": "ar"}


def _servers():
    return _configs(
        {"name": "ar", "strategy": "ar"},
        _server("llama-ar", "ar"),
        _server("llama-draft", "draft", "{llama_server} -m {model_path} -md {draft_model_path} --port {port}",
                draft_model="smollm2-135m"),
        _server("sglang-eagle", "eagle", "{python} -m sglang.launch_server --model {model} --port {port}"))


def test_a_managed_servers_arms_pair_with_that_servers_ar_arm():
    """llama-server's speculative arm against llama-server alone, not the in-process ar of the same model and
    precision; an SGLang arm has no baseline in this run (no SGLang ar arm)."""
    cs = _servers()
    want = {"ar": "ar", "llama-ar": "llama-ar", "llama-draft": "llama-ar"}
    assert config_baselines(cs) == want
    # run.json's configurations (a spec recorded per configuration) pair the same way
    results = [ConfigResult(name=c.name, backend=c.backend, model=c.model, strategy=c.strategy, dtype=c.dtype,
                            quant=c.quant, group_size=c.group_size, spec=c.model_dump(mode="json")) for c in cs]
    assert result_baselines(results) == want


def test_the_ledgers_speedups_use_the_same_pairing():
    """Measurements of a run: the in-process ar listed last (a lookup by model and precision alone finds it)."""
    def m(name, strategy, backend, where, tok_s):
        return ConfigMeasurement(name=name, strategy=strategy, backend=backend, where=where, model="smollm2-135m",
                                 precision="fp32", sampling="greedy", requests_completed=4, wall_s=1.0,
                                 output_tokens=100, tok_s=tok_s)

    ms = [m("llama-ar", "ar", "openai", "managed:llama_server", 100.0),
          m("llama-draft", "draft", "openai", "managed:llama_server", 150.0),
          m("sglang-eagle", "eagle", "openai", "managed:python -m sglang.launch_server", 300.0),
          m("ar", "ar", "inprocess", "cpu", 20.0)]
    ups = speedups(ms)
    assert ups[("llama-draft", "c=1")] == 1.5
    assert ("sglang-eagle", "c=1") not in ups
    assert ups[("ar", "c=1")] == ups[("llama-ar", "c=1")] == 1.0


def test_a_speedup_needs_both_rates_measured():
    """The one speed-up ratio (records/pairing.speedup) the ledger, the report and the run's tables show."""
    assert speedup(150.0, 100.0) == 1.5
    assert speedup(0.0, 100.0) is None and speedup(150.0, 0.0) is None
    assert speedup(None, 100.0) is None and speedup(150.0, None) is None

"""A server arm's precision is what the server runs: llama-server reading a Q4_K_M GGUF is "Q4_K_M" in the plan's
configurations table, the pairing and the recorded run, never the in-process engine's default "fp32"."""

from __future__ import annotations

import gguf
import pytest
from rich.console import Console

from specledger.engine.registry import file_quantization
from specledger.records.config import config_arm, parse_run_config, result_arm
from specledger.records.results import ConfigResult

LLAMA = "{llama_server} -m {model_path} --host {host} --port {port}"


def _gguf(path, file_type: int, vocab: int = 3000):
    """A metadata-only GGUF with a vocabulary (string array) and an array of floats before its file type."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list([f"token{i}" for i in range(vocab)])
    w.add_array("tokenizer.ggml.scores", [0.5] * vocab)
    w.add_file_type(file_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_quantization_is_read_from_the_header_past_the_values_before_it(tmp_path):
    assert file_quantization(str(_gguf(tmp_path / "model.gguf", 15))) == "Q4_K_M"
    # the header says what the file is, whatever its name claims
    assert file_quantization(str(_gguf(tmp_path / "model-q8_0.gguf", 1))) == "F16"
    (tmp_path / "junk-Q5_K_S.gguf").write_bytes(b"not a gguf file")
    assert file_quantization(str(tmp_path / "junk-Q5_K_S.gguf")) == "Q5_K_S"  # the name, where the header cannot say
    assert file_quantization("qwen2.5-coder-1.5b") == "Q4_K_M"  # a registry model, fetched or not
    assert file_quantization(str(tmp_path / "model")) is None


def test_a_llama_server_arm_is_labelled_with_its_files_quantization(tmp_path):
    model = str(_gguf(tmp_path / "model.gguf", 15))
    cfg = parse_run_config({"configs": [
        {"name": "llama-ar", "backend": "openai", "model": model, "openai": {"server": {"command": LLAMA}}},
        {"name": "remote", "backend": "openai", "model": model, "openai": {"base_url": "http://10.0.0.1:8000"}},
        {"name": "ar-w4", "model": model, "dtype": "bf16", "quant": "int4"}]})
    llama, remote, inproc = cfg.configs
    assert config_arm(llama).precision == "Q4_K_M"
    assert config_arm(remote).precision == "as served"  # a server specledger does not start: it cannot tell
    assert config_arm(inproc).precision == "W4A16-g32"
    recorded = ConfigResult(name="llama-ar", backend="openai", model=model, strategy="ar", dtype="fp32", quant="none",
                            spec=llama.model_dump(mode="json"))
    assert result_arm(recorded).precision == "Q4_K_M"


def test_the_plans_configurations_table_shows_what_the_server_runs(tmp_path):
    from specledger.pipeline import plan_table

    model = str(_gguf(tmp_path / "model.gguf", 15))
    cfg = parse_run_config({"configs": [
        {"name": "llama-ar", "backend": "openai", "model": model, "openai": {"server": {"command": LLAMA}}}]})
    console = Console(width=200, record=True, color_system=None)
    console.print(plan_table(cfg))
    row = next(line for line in console.export_text().splitlines() if "llama-ar" in line)
    assert "Q4_K_M" in row and "fp32" not in row


@pytest.mark.parametrize("name", ["llama-ar", "llama-ngram", "llama-draft"])
def test_the_pair_recipes_llama_server_arms_run_q4_k_m(name):
    from tests.bench.test_qwen_pair_recipe import RECIPE
    from specledger.records.config import load_run_config

    bc = next(c for c in load_run_config(RECIPE).configs if c.name == name)
    assert config_arm(bc).precision == "Q4_K_M"

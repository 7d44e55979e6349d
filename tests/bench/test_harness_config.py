"""Run configuration: files and flags, and one-line errors for what a user can get wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specledger.cli.bench import build_config
from specledger.records.config import LoadLevel, config_arm, load_run_config, parse_run_config
from specledger.errors import BadInput

GOOD = """
configs:
  - name: base
    strategy: ar
  - name: lookup
    strategy: lookup
    params: {max_ngram: 3, num_tokens: 8}
    dtype: bf16
    quant: int8
  - name: remote
    backend: openai
    model: llama
    openai: {base_url: "http://127.0.0.1:9/v1", api: completions, retries: 2}
workload: {spec: builtin-quick, categories: [qa], on_bad_line: skip}
load: {concurrency: [1, 4], warmup: 0}
slo: {ttft_s: 0.5}
"""


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_good_yaml_resolves(tmp_path):
    cfg = load_run_config(write(tmp_path, GOOD))
    assert [c.name for c in cfg.configs] == ["base", "lookup", "remote"]
    assert cfg.configs[1].params.given() == {"max_ngram": 3, "num_tokens": 8}
    assert cfg.configs[2].openai.base_url == "http://127.0.0.1:9"  # a trailing /v1 is the API root
    assert cfg.load.levels() == [LoadLevel("c=1", concurrency=1), LoadLevel("c=4", concurrency=4)]
    assert cfg.slo.ttft_s == 0.5
    assert config_arm(cfg.configs[0]).key[:-1] != config_arm(cfg.configs[1]).key[:-1]  # the pairing key, sampling aside


def test_toml(tmp_path):
    p = write(tmp_path, '[[configs]]\nname = "a"\nstrategy = "ar"\n[load]\nrate = [0.5, 1.0]\n', "run.toml")
    cfg = load_run_config(p)
    assert cfg.load.levels() == [LoadLevel("r=0.5", rate=0.5), LoadLevel("r=1", rate=1.0)]


@pytest.mark.parametrize("text, message", [
    ("configs: [{name: a, backend: tgi}]", r"configs\.0\.backend: input should be 'inprocess' or 'openai' \(got 'tgi'\)"),
    ("configs: [{name: a, strategy: medusa}]", r"configs\.0: unknown strategy 'medusa' \(known: ar, lookup"),
    ("configs: [{name: a, temprature: 0.5}]", r"unknown field 'configs\.0\.temprature'"),
    ("configs: [{name: a}]\nlod: {}", r"unknown field 'lod'"),
    ("configs: [{name: a}, {name: a}]", r"two configurations named 'a'"),
    ("configs: [{name: a}]\nload: {concurrency: [1], rate: [2]}", r"load: give either concurrency or rate"),
    ("configs: [{name: a}]\nload: {concurrency: [0]}", r"concurrency must be >= 1"),
    ("configs: []", r"configs: List should have at least 1 item"),
    ("configs: [{name: a, backend: openai, openai: {base_url: localhost:8000}}]", r"base_url must start with http"),
    ("configs: [{name: a, max_tokens: 0}]", r"configs\.0\.max_tokens"),
    ("- just\n- a list", r"expected a mapping at the top level"),
    ("configs: [{name: a\n", r"not valid YAML"),
])
def test_malformed_configs_name_the_problem(tmp_path, text, message):
    p = write(tmp_path, text)
    with pytest.raises(BadInput, match=message) as info:
        load_run_config(p)
    assert str(p) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file():
    with pytest.raises(BadInput, match="does not exist"):
        load_run_config("/nonexistent/run.yaml")


def test_openai_settings_on_inprocess_rejected():
    with pytest.raises(BadInput, match="'openai' settings given for an inprocess backend"):
        parse_run_config({"configs": [{"name": "a", "openai": {}}]})


def _flags(**kw):
    base = dict(strategies=[], backend="inprocess", model=None, dtype="fp32", quant="none", group_size=32,
                params=[], max_tokens=64, temperature=0.0, seed=1, base_url=None, api="chat",
                tokenizer=None, retries=None, timeout=None, connect_timeout=None, overrides={})
    base.update(kw)
    return build_config(None, **base)


def test_flags_build_one_config_per_strategy():
    cfg = _flags(strategies=["ar", "lookup", "eagle"], params=["eagle.top_k=4", "lookup.max_ngram=3"],
                 overrides={"load.concurrency": [1, 2], "workload.limit": 3})
    assert [c.strategy for c in cfg.configs] == ["ar", "lookup", "eagle"]
    assert cfg.configs[0].params.given() == {}
    assert cfg.configs[1].params.given() == {"max_ngram": 3}
    assert cfg.configs[2].params.given() == {"top_k": 4}
    assert cfg.load.concurrency == [1, 2] and cfg.workload.limit == 3 and cfg.seed == 1
    cfg = _flags(strategies=["ar", "lookup"], params=["num_tokens=4"])  # KEY=VALUE: every strategy but ar
    assert [c.params.given() for c in cfg.configs] == [{}, {"num_tokens": 4}]


def test_flags_override_a_file(tmp_path):
    p = write(tmp_path, GOOD)
    cfg = build_config(p, **{k: v for k, v in dict(
        strategies=[], backend="inprocess", model=None, dtype="fp32", quant="none", group_size=32, params=[],
        max_tokens=64, temperature=0.0, seed=0, base_url=None, api="chat", tokenizer=None, retries=None,
        timeout=None, connect_timeout=None).items()}, overrides={"load.rate": [2.0], "output_dir": "/tmp/x"})
    assert cfg.load.rate == [2.0] and cfg.load.concurrency is None
    assert cfg.output_dir == "/tmp/x" and len(cfg.configs) == 3


def test_bad_param_flag():
    with pytest.raises(BadInput, match="--param 'k4'"):
        _flags(strategies=["lookup"], params=["k4"])


def test_cli_prints_one_line_error(tmp_path):
    p = write(tmp_path, "configs: [{name: a, backend: tgi}]")
    out = subprocess.run([sys.executable, "-m", "specledger.cli", "bench", str(p)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: ")
    assert "backend" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


OLD_SPELLING = """
configs:
  - {name: old, strategy: ar, max_new_tokens: 7}
  - {name: new, strategy: ar, max_tokens: 7}
load: {concurrency: [1], warmup_max_new_tokens: 3}
"""


def test_old_spelling_max_new_tokens_still_reads_and_means_the_same(tmp_path, monkeypatch):
    """Config files, recorded runs and flags from before the rename to max_tokens (issue 44 item 4) still work."""
    p = tmp_path / "old.yaml"
    p.write_text(OLD_SPELLING)
    cfg = load_run_config(p)
    old, new = cfg.configs
    assert old.max_tokens == new.max_tokens == 7 and cfg.load.warmup_max_tokens == 3
    assert old.model_dump(exclude={"name"}) == new.model_dump(exclude={"name"})  # written with the new name
    assert "max_new_tokens" not in old.model_dump()
    with pytest.raises(BadInput, match="max_new_tokens"):  # both spellings at once: refused, not one silently won
        parse_run_config({"configs": [{"name": "a", "max_tokens": 3, "max_new_tokens": 4}]})
    # a run recorded before the rename resumes with the limit it ran with (its run.json's conditions.config, from
    # benchmarks/results/builtin-quick-ar-lookup-eagle)
    recorded = json.loads((Path(__file__).parents[1] / "data/run_config_before_max_tokens.json").read_text())
    assert [c.max_tokens for c in parse_run_config(recorded).configs] == [48, 48, 48]
    # the old flag spelling
    from typer.main import get_command
    from typer.testing import CliRunner

    from specledger import pipeline
    from specledger.cli import app

    commands = get_command(app).commands  # type: ignore[attr-defined]
    for name in ("generate", "bench", "compare"):
        assert any({"--max-tokens", "--max-new-tokens"} <= set(o.opts) for o in commands[name].params), name
    seen = []
    monkeypatch.setattr(pipeline, "run_compare", lambda config, **kw: seen.append(config))
    r = CliRunner().invoke(app, ["compare", "--arms", "lookup", "--concurrency", "1", "--max-new-tokens", "5"])
    assert r.exit_code == 0, r.output
    assert {c.max_tokens for c in seen[0].configs} == {5}

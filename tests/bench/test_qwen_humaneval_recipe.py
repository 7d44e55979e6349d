"""The shipped HumanEval recipe (examples/qwen-coder-humaneval.yaml): it parses, every arm resolves without a
model loaded, lossless speculation shares its target's grading (retries included), and --sample reaches the
graded level too."""

from __future__ import annotations

from pathlib import Path

from specledger.bench.managed import render_command
from specledger.pipeline import build_config
from specledger.records.config import config_baselines, load_run_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "qwen-coder-humaneval.yaml"
TARGET, SMALL = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def test_the_humaneval_recipe_has_the_issues_arms(monkeypatch):
    run = load_run_config(RECIPE)
    by_name = {c.name: c for c in run.configs}
    arms = {(c.model, c.strategy, c.dtype, c.quant, c.activations) for c in run.configs if c.backend == "inprocess"}
    assert arms == {
        (TARGET, "ar", "bf16", "none", 16), (TARGET, "ar", "bf16", "int4", 16), (TARGET, "ar", "bf16", "int4", 8),
        (SMALL, "ar", "bf16", "int8", 16), (SMALL, "ar", "bf16", "int4", 16),
        (TARGET, "draft", "bf16", "int4", 16), (TARGET, "lookup", "bf16", "int4", 16)}
    assert all(c.greedy and c.max_tokens == 512 for c in run.configs)
    # every answer graded by its tests: HumanEval on the quality level (all 164), a measured retry loop
    assert run.quality is not None and run.quality.spec == "humaneval" and run.quality.sample is None
    assert run.workload.spec == "humaneval" and run.retry is not None and run.retry.attempts == 3
    # retries ask afresh: with its failed answer in context the model writes it again (README, S27-S28)
    assert not run.retry.feedback and run.retry.temperature > 0
    # lossless speculation is graded as its target (the same tokens): it shares ar-1.5b-w4's quality level
    for name in ("draft-1.5b-w4", "lookup-1.5b-w4"):
        assert config_baselines(run.configs)[name] == "ar-1.5b-w4" and run.quality_source(by_name[name]) == "ar-1.5b-w4"
    graded = {c.name for c in run.configs if run.quality_source(c) == c.name}
    assert graded == {"ar-1.5b-bf16", "ar-1.5b-w4", "ar-1.5b-w4a8", "ar-0.5b-int8", "ar-0.5b-int4", "llama-q4km"}
    # llama-server on the 1.5B's Q4_K_M file alone: no speculation flags
    import specledger.engine.registry as registry

    monkeypatch.setattr(registry, "resolve_model", lambda name: Path(f"/models/{name}.gguf"))
    monkeypatch.setattr("specledger.bench.managed.find_llama_server", lambda: Path("/bin/llama-server"))
    s = by_name["llama-q4km"].openai.server
    argv = render_command(s.command, host="127.0.0.1", port=8080, model=TARGET, run_dir=Path("/tmp"),
                          draft_model=s.draft_model)
    assert argv[argv.index("-m") + 1] == f"/models/{TARGET}.gguf"
    assert not any(a.startswith("--spec") or a == "-md" for a in argv)


def test_sample_reaches_the_graded_level():
    """--sample N grades N problems; the timed levels keep the recipe's own 4 (a quick run stays quick), or
    fewer when N is smaller."""
    run = build_config(RECIPE, quick=False, max_tokens=None, workload={"sample": 40})
    assert run.workload.sample == 4 and run.quality is not None and run.quality.sample == 40
    run = build_config(RECIPE, quick=False, max_tokens=None, workload={"sample": 3})
    assert run.workload.sample == 3 and run.quality is not None and run.quality.sample == 3


def test_compare_on_humaneval_grades_humaneval():
    """`compare --workload humaneval`: the default matrix's quality level grades HumanEval (its pass rate prices
    the configurations), not the built-in short answers."""
    run = build_config(None, quick=True, max_tokens=None, workload={"spec": "humaneval", "sample": 5})
    assert run.workload.spec == "humaneval" and run.quality is not None
    assert (run.quality.spec, run.quality.sample, run.quality.limit) == ("humaneval", 5, None)

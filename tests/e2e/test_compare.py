"""`specledger compare`: the default matrix, optional strategies skipped with a note, the quantization gate and
the verification-cost curve wired into runs (tiny random models, fast), and `compare --quick` end to end (slow)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.conftest import tiny_config, tiny_model, tiny_tensors
from specledger.bench.backends.inprocess import InProcessBackend
from specledger.records.config import config_baselines, parse_run_config
from specledger.records.results import load_run
from specledger.bench.runner import Runner
from specledger.engine.loader import LoadedModel, build_model, weight_bytes
from specledger.engine.timing import CURVE_SIZES
from specledger.pipeline import build_config, default_matrix
from specledger.errors import BadInput, SpecLedgerError
from specledger.ledger.measurements import measurements_from_run
from specledger.records.pairing import precision_label
from tests.bench.test_harness_inprocess import CharTokenizer, workload


def _precision(c) -> str:
    return precision_label(c.dtype, c.quant, c.group_size)


def test_default_matrix_measures_every_combination():
    cfg = default_matrix()
    by = {c.name: c for c in cfg.configs}
    assert list(by) == ["ar-fp32", "lookup-fp32", "eagle-fp32", "draft-fp32", "ar-w8", "ar-w4", "lookup-w4",
                        "eagle-w4", "hier-w4"]
    assert {n: _precision(c) for n, c in by.items() if c.strategy == "ar"} == {
        "ar-fp32": "fp32", "ar-w8": "W8A16", "ar-w4": "W4A16-g32"}
    # speculation x quantization: each method measured on both targets, never derived
    for method in ("lookup", "eagle"):
        assert {_precision(c) for c in cfg.configs if c.strategy == method} == {"fp32", "W4A16-g32"}
    # every speculative configuration has its autoregressive baseline on the same target precision
    assert set(config_baselines(cfg.configs)) == set(by)
    draft = by["draft-fp32"].draft
    assert (draft.model, draft.dtype, draft.quant, draft.group_size) == ("smollm2-135m", "bf16", "int4", 32)
    mid = by["hier-w4"].intermediate
    assert (mid.dtype, mid.quant) == ("bf16", "none")  # the flattest verification curve verifies the tree
    assert {n for n, c in by.items() if c.optional} == {"eagle-fp32", "eagle-w4", "hier-w4"}
    assert cfg.workload.spec == "builtin" and cfg.workload.per_category == 1
    # quality with power: >= 270 graded items (95% interval <= +-6 points) once per target precision
    assert cfg.quality.spec == "builtin-graded" and cfg.quality.limit >= 270
    assert {cfg.quality_source(c) for c in cfg.configs} == {"ar-fp32", "ar-w8", "ar-w4"}
    assert all(c.sampling.temperature == 0.0 for c in cfg.configs)  # greedy: the lossless gate applies


def test_quick_matrix_and_max_tokens():
    quick = default_matrix(quick=True)
    assert [c.name for c in quick.configs] == ["ar-fp32", "lookup-fp32", "ar-w4", "lookup-w4"]
    assert quick.workload.spec == "builtin-quick" and not any(c.optional for c in quick.configs)
    assert {c.max_tokens for c in quick.configs} == {32} and quick.load.warmup_max_tokens == 16
    assert {c.max_tokens for c in build_config(None, quick=False, max_tokens=7).configs} == {7}


def test_custom_config_file(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("configs:\n  - {name: a, strategy: ar, max_tokens: 50}\n  - {name: b, strategy: lookup}\n")
    cfg = build_config(p, quick=True, max_tokens=9)  # the file's matrix, not the quick one
    assert [(c.name, c.max_tokens) for c in cfg.configs] == [("a", 9), ("b", 9)]
    with pytest.raises(BadInput, match="does not exist"):
        build_config(tmp_path / "nope.yaml", quick=False, max_tokens=None)


QUESTIONS = [
    {"question_id": 1, "category": "qa", "turns": ["abc abc abc abc"], "reference": ["abc"]},
    {"question_id": 2, "category": "summarization", "turns": ["xyz xyz xyz xyz xyz"], "reference": ["xyz"]},
]


def _untied(seed: int, dtype: str = "fp32", quant: str = "none") -> LoadedModel:
    """A tiny random model with its own output layer: with tied random embeddings every position's argmax is
    its input token, whatever the rest of the weights, so agreement would say nothing."""
    import torch

    cfg = tiny_config()
    cfg.tie_embeddings = False
    tensors = tiny_tensors(cfg, seed) | {
        "output": torch.randn(cfg.vocab_size, cfg.hidden_size, generator=torch.Generator().manual_seed(seed + 1000))}
    model = build_model(cfg, tensors, dtype=dtype, quant=quant, group_size=32)
    return LoadedModel(model=model, tokenizer=None, config=cfg, name=f"untied{seed}", source=f"random:compare:{seed}",
                       dtype=dtype,
                       quant=quant, group_size=32 if quant == "int4" else None, device="cpu",
                       weight_bytes=weight_bytes(model), load_s=0.0)


def _run(tmp_path, configs, target, *, reference=None, gates=None):
    cfg = parse_run_config({"configs": configs, "workload": {"spec": workload(tmp_path, QUESTIONS)},
                            "load": {"warmup": 0}, "bootstrap": 20, "gates": gates or {}})
    target.tokenizer = CharTokenizer(target.config.vocab_size)
    if reference is not None:  # the gate reads the quality text with the reference's own tokenizer
        reference.tokenizer = reference.tokenizer or target.tokenizer
    runner = Runner(cfg, tmp_path / "run", show_progress=False,
                    backend_factory=lambda bc: InProcessBackend(bc, models={"target": target, "intermediate": target}),
                    reference_factory=None if reference is None else (lambda bc: reference))
    return runner.run()


def test_unavailable_optional_strategy_is_skipped_with_a_note(tmp_path, monkeypatch):
    import specledger.decoding.factory as factory

    real = factory.make_strategy

    def make_strategy(name, target, **params):
        if name == "hier":
            raise ModuleNotFoundError("No module named 'specledger.decoding.drafters.hierarchy'")
        if name == "eagle":
            raise BadInput("no EAGLE head is shipped for tiny3")
        return real(name, target, **params)

    monkeypatch.setattr(factory, "make_strategy", make_strategy)
    configs = [{"name": "ar", "strategy": "ar", "max_tokens": 6},
               {"name": "eagle", "strategy": "eagle", "max_tokens": 6, "optional": True},
               {"name": "hier", "strategy": "hier", "intermediate": {"model": "target"}, "max_tokens": 6,
                "optional": True},
               {"name": "lookup", "strategy": "lookup", "max_tokens": 6}]
    run = _run(tmp_path, configs, tiny_model(seed=3))
    assert run.status == "complete" and [c.name for c in run.configs] == ["ar", "lookup"]
    assert "skipped eagle: no EAGLE head is shipped for tiny3" in run.notes
    assert any(n.startswith("skipped hier: strategy 'hier' is not available in this build") for n in run.notes)
    assert [c.name for c in load_run(tmp_path / "run").configs] == ["ar", "lookup"]
    # a configuration that is not optional still stops the run, with its reason
    (tmp_path / "again").mkdir()
    with pytest.raises(SpecLedgerError, match="configuration 'eagle': no EAGLE head"):
        _run(tmp_path / "again", [dict(configs[1], optional=False)], tiny_model(seed=3))


def test_quantization_gate_and_verify_curve_are_in_the_run(tmp_path):
    fp32, w4 = _untied(5), _untied(5, dtype="bf16", quant="int4")
    configs = [{"name": "ar-w4", "strategy": "ar", "dtype": "bf16", "quant": "int4", "max_tokens": 6},
               {"name": "lookup-w4", "strategy": "lookup", "dtype": "bf16", "quant": "int4", "max_tokens": 6}]
    run = _run(tmp_path, configs, w4, reference=fp32, gates={"min_agreement": 0.8})
    # the figure the gate judges, computed here: argmax agreement over the quality text, teacher-forced
    import torch

    from specledger.data import quality_text

    ids = CharTokenizer(64).encode(quality_text())[: fp32.config.max_seq_len]
    x = torch.tensor([ids])
    with torch.inference_mode():
        a, b = (m.model(x, m.model.new_cache(len(ids)))[0].argmax(-1) for m in (fp32, w4))
    want = (a == b).double().mean().item()
    assert 0.8 < want < 0.95  # W4 of a tiny random model: well above chance (1/64), below the default gate
    for c in run.configs:
        gate = next(g for g in c.gates if g.name == "quantization")
        assert gate.passed and c.comparable
        f = gate.figures
        assert f["top1_agreement"] == pytest.approx(want) and f["mean_kl"] > 0 and f["reference"] == "untied5:fp32"
        assert f["tokens"] == len(ids) and f["min_agreement"] == 0.8
        assert c.agreement["top1_agreement"] == f["top1_agreement"]
        assert [p.tokens for p in c.verify_curve] == list(CURVE_SIZES) and all(p.ms > 0 for p in c.verify_curve)
    # the ledger (and so the report) reads the curve back
    ms = measurements_from_run(tmp_path / "run")
    assert all([p.tokens for p in m.verify_curve] == list(CURVE_SIZES) for m in ms)


def test_quantization_gate_failure_marks_not_comparable(tmp_path):
    other = _untied(6)  # a different model: agreement near chance
    configs = [{"name": "ar-w8", "strategy": "ar", "dtype": "bf16", "quant": "int8", "max_tokens": 4}]
    run = _run(tmp_path, configs, _untied(5, dtype="bf16", quant="int8"), reference=other)
    c = run.configs[0]
    gate = next(g for g in c.gates if g.name == "quantization")
    assert gate.passed is False and gate.figures["top1_agreement"] < 0.95
    assert not c.comparable and c.comparable_reason.startswith("quantization: top-1 agreement")
    assert "below 95.0%" in c.comparable_reason and "vs untied6:fp32" in c.comparable_reason


def test_warmup_answers_are_capped(tmp_path):
    seen: list[int] = []

    class Recording(InProcessBackend):
        async def complete(self, messages, *, max_tokens, min_tokens=None):
            seen.append(max_tokens)
            return await super().complete(messages, max_tokens=max_tokens, min_tokens=min_tokens)

    lm = tiny_model(seed=1)
    lm.tokenizer = CharTokenizer(lm.config.vocab_size)
    cfg = parse_run_config({"configs": [{"name": "ar", "strategy": "ar", "max_tokens": 9}],
                            "workload": {"spec": workload(tmp_path, QUESTIONS)}, "bootstrap": 0,
                            "load": {"warmup": 1, "warmup_max_tokens": 3}})
    Runner(cfg, tmp_path / "run", show_progress=False,
           backend_factory=lambda bc: Recording(bc, models={"target": lm})).run()
    assert seen == [3, 9, 9]


def test_fp32_target_has_no_quantization_gate(tmp_path):
    run = _run(tmp_path, [{"name": "ar", "strategy": "ar", "max_tokens": 4}], tiny_model(seed=1),
               reference=tiny_model(seed=2))
    assert run.configs[0].agreement is None and [g.name for g in run.configs[0].gates] == ["pass_rate"]


@pytest.mark.slow
def test_compare_quick_end_to_end(tmp_path):
    from specledger.cli import app

    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["compare", "--quick", "--out", str(out), "--samples", "300", "--no-progress"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    flat = result.output.replace("\n", "")
    assert f"report: {(out / 'report.html').resolve()}" in flat
    assert "Cost per accepted task" in flat and "Speed-up over autoregressive" in flat and "Quality gates" in flat
    for name in ("run.json", "requests.jsonl", "summary.csv", "ledger.json", "report.html"):
        assert (out / name).is_file(), name
    run = load_run(out)
    assert run.status == "complete"
    assert [c.name for c in run.configs] == ["ar-fp32", "lookup-fp32", "ar-w4", "lookup-w4"]
    ledger = json.loads((out / "ledger.json").read_text())
    assert run.answer == ledger["answer"] and run.answer["scenarios"][0]["recommended"]  # run.json has the decision
    assert list(json.loads((out / "run.json").read_text())).index("answer") == 5  # ... after id, times, status
    assert {r["name"] for r in ledger["configs"]} == {c.name for c in run.configs}
    assert all(r["verdict"] for r in ledger["configs"]), ledger["configs"]
    by = {c.name: c for c in run.configs}
    gate = next(g for g in by["ar-w4"].gates if g.name == "quantization")
    assert gate.figures["reference"] == "smollm2-135m:fp32" and 0.5 < gate.figures["top1_agreement"] <= 1.0
    assert not any(g.name == "quantization" for g in by["ar-fp32"].gates)
    assert next(g for g in by["lookup-fp32"].gates if g.name == "lossless").passed
    assert all(len(c.verify_curve) == len(CURVE_SIZES) for c in run.configs)
    html = (out / "report.html").read_text()
    assert "recorded no verification-cost curve" not in html and "lookup-w4" in html
    # concurrency swept by default: every configuration at c=1 and c=4, and where lookup stops paying
    assert all([lr.load for lr in c.loads if lr.load != "quality"] == ["c=1", "c=4"] for c in run.configs)
    assert {b["config"] for b in ledger["concurrency"]} == {"lookup-fp32", "lookup-w4"}
    assert 'id="concurrency-table"' in html and "Throughput and speed-up vs concurrency" in flat
    # torch's thread count chosen by the probe (both targets timed) and recorded
    choice = run.noise.thread_choice
    assert choice.source == "probe" and {p.model for p in choice.probes} == {"smollm2-135m:fp32",
                                                                             "smollm2-135m:bf16-int4g32"}
    # the quality level: 40 graded items per target, each once, 16 in flight
    quality = next(lr for lr in by["ar-fp32"].loads if lr.load == "quality")
    assert quality.concurrency == 16
    source = next(r for r in ledger["configs"] if r["name"] == "lookup-fp32")["pass_rate_source"]
    assert source.startswith("borrowed: ar-fp32's ") and source.endswith("/40 (lossless)"), source

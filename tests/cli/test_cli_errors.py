"""Wrong command lines of bench, cost, report, show and import: one line on stderr naming the problem, exit 2,
never a traceback (issue 42)."""

from __future__ import annotations

import sys

import pytest

from specledger.cli import main

OFFLINE = ["--backend", "openai", "--base-url", "http://127.0.0.1:9", "--workload", "synthetic:in=4,out=2,n=1",
           "--no-progress"]


@pytest.mark.parametrize("args, says", [
    (["bench", "--bogus"], "No such option: --bogus"),
    (["bench", "--concurrency", "abc"], "--concurrency: expected numbers"),
    (["bench", "--repeats", "0"], "'--repeats'"),
    (["bench", "--workload", "xml:w.xml", "--no-progress"], "unknown format 'xml' (known: spec-bench"),
    (["bench", "--workload", "csv:", "--no-progress"], "give the file after the colon (csv:PATH)"),
    (["bench", "--workload", "missing.jsonl", "--no-progress"], "workload file not found: missing.jsonl"),
    (["bench", "--resume", "nowhere"], "nowhere: no run.json"),
    (["bench", "--output-dir", "afile/runs", *OFFLINE], "cannot write the run directory afile/runs/"),
    (["bench", "--sustain", "five", *OFFLINE], "--sustain: expected a duration such as 300"),
    (["compare", "--sustain", "-3m", "--no-report"], "--sustain: expected a duration such as 300"),
    (["bench", "--cpu-watts", "0", *OFFLINE], "'--cpu-watts'"),
    (["cost", "nowhere"], "nowhere: no run.json"),
    (["cost", "--init", "afile/cost.yaml"], "--init afile/cost.yaml: cannot write it"),
    (["cost", "--samples", "-1", "x"], "'--samples'"),
    (["report", "nowhere"], "nowhere: no run.json"),
    (["show", "nowhere"], "nowhere: no run.json"),
    (["import", "xml", "w.xml"], "unknown format 'xml'"),
    (["import", "vllm-bench", "."], ".: a directory, not a file"),
])
def test_argument_errors_are_one_line_and_exit_2(args, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "w.xml").write_text("<q>hi</q>\n")
    monkeypatch.setattr(sys, "argv", ["specledger", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]  # bench may say which workload it read first
    assert last.startswith("error: ") and says in last, err


@pytest.mark.parametrize("name, text, says", [
    ("deep.yaml", "configs: " + "[" * 50_000 + "]" * 50_000 + "\n", "deep.yaml:1: "),  # libyaml's limit or ours
    ("deep2.yaml", "configs:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 100)) + " " * 100 + "v: 1\n",
     "deep2.yaml:33: nested more than 32 deep"),
    ("deep.toml", "a = " + "[" * 50_000 + "]" * 50_000 + "\n", "deep.toml: nested too deep"),
    ("bomb.yaml", "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
     "bomb.yaml: its aliases (*name) expand to more than 200,000 values"),
    ("bin.yaml", b"configs:\n\x00\xff\xfe\x01", "bin.yaml: not a text file (run configurations are YAML)"),
])
def test_hostile_run_configurations_are_one_line_and_exit_2(name, text, says, tmp_path, monkeypatch, capsys):
    """Nested 50,000 deep (was a RecursionError), an alias bomb, a binary file (was a UnicodeDecodeError)."""
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.setattr(sys, "argv", ["specledger", "bench", str(path), "--no-progress"])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: {tmp_path}/{says}"), err


@pytest.mark.parametrize("strategy, role", [("draft", "draft"), ("hier", "intermediate")])
def test_bench_takes_the_model_flags_its_own_error_suggests(strategy, role, monkeypatch, capsys):
    """`bench -s draft` says "needs a draft model (e.g. --draft-model target ...)": that suggestion, appended to
    the same command, is a configuration with that model (bench had no such flag)."""
    from specledger.bench import runner
    from specledger.decoding.params import MODEL_PARAMS

    base = ["specledger", "bench", "-s", strategy, "-s", "ar", "--workload", "synthetic:in=4,out=2,n=1",
            "--no-progress"]
    monkeypatch.setattr(sys, "argv", base)
    with pytest.raises(SystemExit):
        main()
    said = capsys.readouterr().err.strip().splitlines()[-1]
    example = MODEL_PARAMS[role].example
    assert f"needs {MODEL_PARAMS[role].what} (e.g. {example};" in said, said

    seen = []

    def captured(cfg, **kw):
        seen.append(cfg)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_benchmark", captured)
    monkeypatch.setattr(sys, "argv", base + example.split())
    with pytest.raises(SystemExit):
        main()
    by_name = {c.name: c for c in seen[0].configs}
    spec = getattr(by_name[strategy], role)
    assert spec is not None and spec.model == by_name[strategy].model  # 'target': the target's own file
    assert (spec.quant, spec.dtype) == (("int4", "fp32") if role == "draft" else ("none", "bf16"))
    assert getattr(by_name["ar"], role) is None  # only the strategies that use the role get it
    monkeypatch.setattr(sys, "argv", ["specledger", "bench", "-s", "ar", *example.split(), "--no-progress"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2 and f"does not use {MODEL_PARAMS[role].what}" in capsys.readouterr().err

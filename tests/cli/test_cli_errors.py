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

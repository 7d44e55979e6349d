"""The long-input sweep (issue 54 item 3): `bench --input-tokens` is a synthetic workload of several prompt lengths,
and the report draws median TTFT against prompt length."""

from __future__ import annotations

import pytest

from specledger.bench.runner import Runner
from specledger.bench.synthetic import estimate_tokens
from specledger.bench.workload import load_workload
from specledger.cli.bench import _input_sweep
from specledger.errors import BadInput
from specledger.ledger.inputs import load_inputs
from specledger.ledger.price import price_run
from specledger.records.config import parse_run_config
from specledger.report import charts
from specledger.report.html import write_report
from tests.support.fake_backend import SleepBackend


class LengthBackend(SleepBackend):
    """Answers at once, its first token after 1 ms per 100 prompt tokens; reports the prompt's token count."""

    async def complete(self, messages, *, max_tokens, min_tokens=None):
        n = estimate_tokens(messages[-1]["content"])
        self.seconds = lambda i, bc: n / 100_000
        c = await super().complete(messages, max_tokens=max_tokens, min_tokens=min_tokens)
        c.prompt_tokens = n
        return c


def test_input_tokens_is_a_sweep_of_whole_prompt_lengths():
    spec, per_category = _input_sweep("64,512", None, 2)
    qs = load_workload(spec)
    assert per_category is None and [q.prompt_tokens for q in qs] == [64, 64, 512, 512]
    assert len({q.turns for q in qs}) == 4 and all(q.max_tokens == 32 for q in qs)
    assert [estimate_tokens(q.turns[0]) for q in qs] == [64, 64, 512, 512]  # trimmed by the template when sent
    with pytest.raises(BadInput, match="not both"):
        _input_sweep("64", "builtin", None)
    with pytest.raises(BadInput, match="--input-tokens"):
        _input_sweep("0,64", None, None)
    assert [q.question_id for q in load_workload("synthetic:in=16,out=4,n=2")] == ["synthetic-0", "synthetic-1"]


def run_ledger(tmp_path, spec):
    cfg = parse_run_config({"configs": [{"name": "ar"}, {"name": "lookup", "strategy": "lookup"}],
                            "workload": {"spec": spec}, "load": {"warmup": 0}, "calibration": False,
                            "verify_curve": False, "bootstrap": 0})
    calls: list[str] = []
    Runner(cfg, tmp_path / "run", show_progress=False,
           backend_factory=lambda bc: LengthBackend(bc, calls, lambda n, bc: 0.0)).run()
    inputs = load_inputs(None)
    inputs.base.acceptance.pass_rate = 1.0  # the synthetic workload has no reference answers
    return price_run(tmp_path / "run", inputs, samples=50)


def test_the_report_draws_ttft_against_prompt_length(tmp_path):
    ledger = run_ledger(tmp_path, "synthetic:in=100+400+1600,out=4,n=1")
    chart = charts.ttft_by_input_length(ledger)
    assert chart is not None and "ar" in chart and "lookup" in chart and "prompt tokens" in chart
    html = write_report(tmp_path / "run", ledger, tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'id="chart-ttft_length"' in html


def test_one_prompt_length_draws_no_curve(tmp_path):
    assert charts.ttft_by_input_length(run_ledger(tmp_path, "synthetic:in=100,out=4,n=2")) is None

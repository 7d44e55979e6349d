"""Strategy parameters are checked before anything loads: each message names the flag or parameter to use."""

from __future__ import annotations

import pytest

from conftest import tiny_model
from specledger.decoding import factory
from specledger.decoding.factory import STRATEGIES, check_params, make_strategy
from specledger.errors import BadInput


@pytest.mark.parametrize("name,params,needle", [
    ("draft", {}, "strategy 'draft' needs a draft model (e.g. --draft-model target --draft-quant int4; "
                  "in a run configuration: draft: {model: smollm2-135m, quant: int4})"),
    ("hier", {"drafter": "lookup"}, "strategy 'hier' needs an intermediate model (e.g. --intermediate-model target"),
    ("lookup", {"num_tokns": 3}, "strategy 'lookup' has no parameter 'num_tokns'; did you mean num_tokens? "
                                 "(it accepts: num_tokens, max_ngram, min_ngram)"),
    ("ar", {"depth": 3}, "strategy 'ar' has no parameter 'depth' (it takes no parameters)"),
    ("lookup", {"draft": "target"}, "strategy 'lookup' does not use a draft model (--draft-model is for --strategy draft)"),
    ("eagle", {"intermediate": "target"}, "(--intermediate-model is for --strategy hier)"),
    ("eagle", {"top_k": "ten"}, "strategy 'eagle' parameter top_k='ten': input should be a valid integer"),
    ("hier", {"intermediate": "target", "min_chain": [1, "x"]}, "parameter min_chain=[1, 'x']"),
    ("medusa", {}, "unknown strategy 'medusa' (choose from ar, lookup, draft, eagle, hier)"),
])
def test_bad_parameters_say_what_to_give(name, params, needle):
    with pytest.raises(BadInput) as exc:
        check_params(name, params)
    assert needle in str(exc.value)
    assert "__init__" not in str(exc.value) and "positional argument" not in str(exc.value)


def test_good_parameters_pass_converted():
    assert check_params("eagle", {"top_k": 10.0, "depth": 3, "total_nodes": "auto"}) == {
        "top_k": 10, "depth": 3, "total_nodes": "auto"}
    assert check_params("lookup", {}) == {}
    for name in STRATEGIES:  # every strategy's declared types can be checked
        needs = {"draft": {"draft": "target"}, "hier": {"intermediate": "target"}}.get(name, {})
        assert check_params(name, needs) == needs


def test_a_bug_inside_a_strategy_is_not_a_user_error(monkeypatch):
    class Broken(factory.strategy_class("lookup")):
        def __init__(self, target, num_tokens: int = 3) -> None:
            raise TypeError("a genuine bug")

    monkeypatch.setattr(factory, "strategy_class", lambda name: Broken)
    with pytest.raises(TypeError, match="a genuine bug"):
        make_strategy("lookup", tiny_model(), num_tokens=3)


def test_parameters_are_checked_before_loading(monkeypatch):
    from typer.testing import CliRunner

    from specledger.cli import app
    from specledger.engine import loader

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the parameters were checked")

    monkeypatch.setattr(loader, "load_model", no_loading)
    r = CliRunner().invoke(app, ["generate", "hi", "--strategy", "lookup", "-p", "num_tokns=3"])
    assert isinstance(r.exception, BadInput) and "did you mean num_tokens?" in str(r.exception)


def test_draft_strategy_message_at_the_command_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "specledger.cli", "generate", "hi", "--strategy", "draft"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error: strategy 'draft' needs a draft model (e.g. --draft-model target" in r.stderr

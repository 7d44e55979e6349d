"""Strategy parameters are checked before anything loads: each message names the flag or parameter to use."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_model
from specledger.decoding import factory
from specledger.decoding.factory import STRATEGIES, check_params, make_strategy
from specledger.decoding.params import parse_params
from specledger.errors import BadInput


@pytest.mark.parametrize("name,params,needle", [
    ("draft", {}, "strategy 'draft' needs a draft model (e.g. --draft-model target --draft-quant int4; "
                  "in a run configuration: draft: {model: smollm2-135m, quant: int4})"),
    ("hier", {"drafter": "lookup"}, "strategy 'hier' needs an intermediate model (e.g. --intermediate-model target"),
    ("lookup", {"num_tokns": 3}, "strategy 'lookup' has no parameter 'num_tokns'; did you mean num_tokens? "
                                 "(it accepts: max_nodes, max_ngram, min_ngram, draft_length)"),
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
        "top_k": 10, "depth": 3, "max_nodes": "auto"}  # (total_nodes: the cap's old name, still read)
    assert check_params("lookup", {}) == {}
    for name in STRATEGIES:  # every strategy's declared types can be checked
        needs = {"draft": {"draft": "target"}, "hier": {"intermediate": "target"}}.get(name, {})
        assert check_params(name, needs) == needs


def test_a_bug_inside_a_strategy_is_not_a_user_error(monkeypatch):
    class Broken(factory.strategy_class("lookup")):
        def __init__(self, target, max_nodes: int = 3) -> None:
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


# --- one model per strategy, chosen by `strategy` in a run configuration --------------------------------------


def _yaml(tmp_path, text):
    from specledger.records.config import load_run_config

    p = tmp_path / "run.yaml"
    p.write_text(text)
    return load_run_config(p)


@pytest.mark.parametrize("text,needle", [
    ("configs: [{name: lk, strategy: lookup, params: {num_tokns: 3}}]",
     "configs.0.params: strategy 'lookup' has no parameter 'num_tokns'; did you mean num_tokens?"),
    ("configs: [{name: e, strategy: eagle, params: {top_k: ten}}]",
     "configs.0.params: strategy 'eagle' parameter top_k='ten': input should be a valid integer"),
    ("configs: [{name: d, strategy: draft}]",
     "configs.0: strategy 'draft' needs a draft model (e.g. --draft-model target --draft-quant int4; "
     "in a run configuration: draft: {model: smollm2-135m, quant: int4})"),
    ("configs: [{name: lk, strategy: lookup, draft: {model: target}}]",
     "configs.0: strategy 'lookup' does not use a draft model (--draft-model is for --strategy draft)"),
    ("configs: [{name: d, strategy: draft, params: {draft: target}}]", "configs.0.params: give a draft model beside"),
    ("configs: [{name: a, strategy: ar, params: {depth: 3}}]", "(it takes no parameters)"),
])
def test_a_run_configuration_fails_at_parse_naming_strategy_and_field(tmp_path, text, needle):
    with pytest.raises(BadInput) as exc:
        _yaml(tmp_path, text)
    assert needle in str(exc.value)


def test_the_strategy_chooses_the_parameter_model(tmp_path):
    from specledger.decoding.params import PARAMS, EagleParams, LookupParams, OtherParams

    cfg = _yaml(tmp_path, """
configs:
  - {name: lk, strategy: lookup, params: {num_tokens: 3.0}}
  - {name: e, strategy: eagle, params: {top_k: 4}}
  - {name: d, strategy: draft, draft: {model: target, quant: int4}}
  - {name: srv, backend: openai, strategy: eagle, params: {spec_tokens: 5}}
""")
    lk, e, d, srv = cfg.configs
    assert isinstance(lk.params, LookupParams) and lk.params.given() == {"num_tokens": 3}
    assert isinstance(e.params, EagleParams) and e.params.depth == 3 and e.params.given() == {"top_k": 4}
    assert type(d.params) is PARAMS["draft"] and d.target.model == d.draft.model
    assert isinstance(srv.params, OtherParams) and srv.params.given() == {"spec_tokens": 5}  # a server's own
    with pytest.raises(ValueError, match="params for strategy 'lookup' given to strategy 'eagle'"):
        type(e).model_validate({"name": "x", "strategy": "eagle", "params": LookupParams()})


def test_results_keep_params_as_the_plain_mapping_given():
    """run.json has always held params as given; an old run's configuration parses and writes back the same."""
    from specledger.records.config import parse_run_config

    old = {"configs": [{"name": "lookup", "strategy": "lookup", "params": {"num_tokens": 3}},
                       {"name": "ar", "strategy": "ar", "params": {}},
                       {"name": "v", "backend": "openai", "strategy": "vllm-eagle", "params": {"k": 8}}]}
    dumped = parse_run_config(old).model_dump(mode="json")
    assert [c["params"] for c in dumped["configs"]] == [{"num_tokens": 3}, {}, {"k": 8}]
    assert parse_run_config(dumped).model_dump(mode="json") == dumped


def test_parameter_models_mirror_the_strategies():
    """Names in the strategies' order, and the same defaults: the models are the one declaration to check."""
    import inspect

    from specledger.decoding.params import PARAMS, accepted

    for name, cls in PARAMS.items():
        sig = list(inspect.signature(factory.strategy_class(name).__init__).parameters.values())[2:]
        assert accepted(name) == [p.name for p in sig], name
        for p in sig:
            if p.name in cls.model_fields:
                assert cls.model_fields[p.name].default == p.default, (name, p.name)


@pytest.mark.parametrize("args", [
    ["bench", "--strategy", "lookup", "-p", "num_tokns=3", "--no-progress"],
    ["generate", "hi", "--strategy", "lookup", "-p", "num_tokns=3"],
    ["serve", "--strategy", "lookup", "-p", "num_tokns=3"],
])
def test_every_command_rejects_a_typo_before_loading(monkeypatch, tmp_path, args):
    from typer.testing import CliRunner

    from specledger.cli import app
    from specledger.engine import loader

    def no_loading(*a, **kw):
        raise AssertionError("a model was loaded before the parameters were checked")

    monkeypatch.setattr(loader, "load_model", no_loading)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, args)
    assert isinstance(r.exception, BadInput), r.output
    assert "strategy 'lookup' has no parameter 'num_tokns'; did you mean num_tokens?" in str(r.exception)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag, message", [
    (["--max-batch", "0"], "--max-batch must be >= 1 (got 0)"),
    (["--prefill-chunk", "0"], "--prefill-chunk must be >= 1 (got 0)"),
])
def test_serve_rejects_bad_batching_flags_before_loading(monkeypatch, flag, message):
    from typer.testing import CliRunner

    from specledger.cli import app
    from specledger.engine import loader

    def no_loading(*a, **kw):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(loader, "load_model", no_loading)
    r = CliRunner().invoke(app, ["serve", *flag])
    assert isinstance(r.exception, BadInput), r.output
    assert str(r.exception) == message


@pytest.mark.parametrize("name,old,new,value", [
    ("lookup", "num_tokens", "max_nodes", 6), ("draft", "num_tokens", "max_nodes", 3),
    ("eagle", "total_nodes", "max_nodes", 12), ("hier", "max_chain", "max_nodes", 7),
    ("hier", "total_nodes", "inner_max_nodes", 20), ("hier", "lookup_tokens", "inner_max_nodes", 5),
])
def test_the_draft_size_cap_has_one_name_and_its_old_ones_still_read(name, old, new, value):
    """decoding/params.py: the old spelling means the same as the name now, and is written back as given."""
    by_old, by_new = parse_params(name, {old: value}), parse_params(name, {new: value})
    assert by_old.arguments() == by_new.arguments() == {new: value}
    assert by_old.given() == {old: value} and by_new.given() == {new: value}
    with pytest.raises(BadInput, match=f"parameter {new} is given twice"):
        check_params(name, {old: value, new: value})


def test_an_old_hier_configuration_with_both_inner_caps_keeps_its_drafters():
    """Before one name a hier configuration could give total_nodes and lookup_tokens; its drafter's one counts."""
    for drafter, want in (("lookup", 5), ("eagle", 20)):
        p = parse_params("hier", {"drafter": drafter, "total_nodes": 20, "lookup_tokens": 5})
        assert p.arguments()["inner_max_nodes"] == want
    assert make_strategy("lookup", tiny_model(), num_tokens=6).batch_drafter(1).max_nodes == 6

"""Each strategy's parameters as one pydantic model: the one place their names and types are declared.

The command line (-p KEY=VALUE), a run configuration (records/config.py: `params`, chosen by `strategy`)
and make_strategy all validate with these models before any model is loaded, so a typo or a wrong type is
reported as the user's mistake, naming the strategy and the parameter, and a TypeError from inside a
strategy stays a bug. Model-valued parameters (a draft model, intermediate models) are roles: given by
flags or beside `params` in a configuration, declared by `roles`. Only the parameters given are passed on
(`arguments()`), so each strategy's own defaults apply (tests check the defaults here match them).

The draft-size cap has one name, `max_nodes`: the most nodes one proposal the target verifies may hold (a chain's
tokens, a tree's nodes; with draft_length=fixed, what every step drafts). `hier` also caps its inner drafter's
proposals (`inner_max_nodes`). The names the cap had before (lookup and draft: num_tokens; eagle: total_nodes;
hier: max_chain, and total_nodes / lookup_tokens for its inner drafter) are still read, from the command line and
run configurations alike, and a run configuration is written back as it was given (`given()`).
Torch-free: the harness and the configuration parser import it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from specledger.errors import BadInput


@dataclass(frozen=True)
class ModelParam:
    """A parameter whose value is a model, and how a user gives one."""

    what: str
    flag: str
    example: str  # command-line flags
    config: str  # the same in a run configuration file


MODEL_PARAMS = {
    "draft": ModelParam("a draft model", "--draft-model", "--draft-model target --draft-quant int4",
                        "draft: {model: smollm2-135m, quant: int4}"),
    "intermediate": ModelParam("an intermediate model", "--intermediate-model",
                               "--intermediate-model target --intermediate-dtype bf16",
                               "intermediate: {model: smollm2-135m, dtype: bf16}"),
}


# how a batch sizes each step's drafts (decoding/sizing/policy.py): the cost-aware planner, or K nodes every step
DraftLength = Literal["adaptive", "fixed"]
DRAFT_LENGTHS: tuple[str, ...] = get_args(DraftLength)


def _cap(default: Any, *old: str, name: str = "max_nodes") -> Any:
    """A draft-size cap under its one name, its old spellings still read (module docstring)."""
    return Field(default, validation_alias=AliasChoices(name, *old))


class StrategyParams(BaseModel):
    """Parameters of one strategy; `strategy` says which (the discriminator; never written out)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    roles: ClassVar[tuple[str, ...]] = ()  # model-valued parameters the strategy requires (MODEL_PARAMS)
    _spelled: dict[str, str] = PrivateAttr(default_factory=dict)  # a field given by an old name -> that name

    @classmethod
    def names(cls) -> list[str]:
        return [n for n in cls.model_fields if n != "strategy"]

    @classmethod
    def old_names(cls) -> dict[str, str]:
        """Each old spelling still read -> the parameter's name now."""
        return {old: n for n, f in cls.model_fields.items() if isinstance(f.validation_alias, AliasChoices)
                for old in f.validation_alias.choices if old != n and isinstance(old, str)}

    @classmethod
    def _one_spelling(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The mapping with one key per parameter (a strategy whose parameter had two old names drops one)."""
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _remember_spelling(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, dict):
            return handler(data)
        data = cls._one_spelling(data)
        out = handler(data)
        old = cls.old_names()
        out._spelled = {old[k]: k for k in data if k in old}
        return out

    def arguments(self) -> dict[str, Any]:
        """The parameters set (validated and converted), in declaration order, by their names now: what the
        strategy is built with; defaults left to it."""
        return {n: getattr(self, n) for n in self.names() if n in self.model_fields_set}

    def given(self) -> dict[str, Any]:
        """The same, each by the name it was given (an old spelling kept): what a run configuration records."""
        return {self._spelled.get(n, n): v for n, v in self.arguments().items()}


class ArParams(StrategyParams):
    strategy: Literal["ar"] = Field("ar", exclude=True)


class LookupParams(StrategyParams):
    strategy: Literal["lookup"] = Field("lookup", exclude=True)
    max_nodes: int | None = _cap(None, "num_tokens")  # None: 8
    max_ngram: int = 3
    min_ngram: int = 1
    draft_length: DraftLength = "adaptive"


class DraftParams(StrategyParams):
    strategy: Literal["draft"] = Field("draft", exclude=True)
    roles: ClassVar[tuple[str, ...]] = ("draft",)
    max_nodes: int = _cap(4, "num_tokens")
    draft_length: DraftLength = "adaptive"
    share_prompt_kv: bool = True  # a draft of the target's own weights copies the prompt's cache entries


class EagleParams(StrategyParams):
    strategy: Literal["eagle"] = Field("eagle", exclude=True)
    head: Any = None  # a directory, an EagleHead, or None: the head shipped for the target
    top_k: int = 10
    depth: int = 3
    max_nodes: int | str = _cap("auto", "total_nodes")
    head_dtype: str | None = None
    draft_length: DraftLength = "adaptive"


class HierParams(StrategyParams):
    strategy: Literal["hier"] = Field("hier", exclude=True)
    roles: ClassVar[tuple[str, ...]] = ("intermediate",)
    drafter: str = "eagle"
    head: Any = None
    top_k: int = 10
    depth: int = 3
    # the inner drafter's cap (None: 30 for an EAGLE tree, 10 for lookup); both old names were accepted before
    inner_max_nodes: int | None = _cap(None, "total_nodes", "lookup_tokens", name="inner_max_nodes")
    min_chain: int | list[int] = 6
    max_nodes: int = _cap(10, "max_chain")
    draft_length: DraftLength = "adaptive"
    share_prompt_kv: bool = True  # an intermediate of its verifier's own weights copies the prompt's cache entries

    @classmethod
    def _one_spelling(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Before one name, a configuration could give total_nodes and lookup_tokens, the drafter using one."""
        if "total_nodes" in data and "lookup_tokens" in data:
            unused = "lookup_tokens" if data.get("drafter", "eagle") == "eagle" else "total_nodes"
            data = {k: v for k, v in data.items() if k != unused}
        return data


class OtherParams(StrategyParams):
    """A server's strategy (openai backend): its parameters are its own business, recorded as given."""

    model_config = ConfigDict(extra="allow")
    strategy: str | None = Field(None, exclude=True)

    def given(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


PARAMS: dict[str, type[StrategyParams]] = {
    "ar": ArParams, "lookup": LookupParams, "draft": DraftParams, "eagle": EagleParams, "hier": HierParams,
}
STRATEGIES = tuple(PARAMS)  # every one runs on the continuous-batching scheduler (decoding/loop/scheduler.py)


def check_draft_length(value: str) -> str:
    """A strategy built in code gets the same one line as one whose parameters were validated."""
    if value not in DRAFT_LENGTHS:
        raise BadInput(f"draft_length must be {' or '.join(DRAFT_LENGTHS)} (got {value!r})")
    return value


def params_class(name: str) -> type[StrategyParams]:
    if name not in PARAMS:
        raise BadInput(f"unknown strategy {name!r} (choose from {', '.join(STRATEGIES)})")
    return PARAMS[name]


def accepted(name: str) -> list[str]:
    """Everything the strategy accepts, its models first."""
    cls = params_class(name)
    return [*cls.roles, *cls.names()]


def unused_role(name: str, role: str) -> str:
    mp = MODEL_PARAMS[role]
    users = " or ".join(f"--strategy {s}" for s in STRATEGIES if role in PARAMS[s].roles)
    return f"strategy {name!r} does not use {mp.what} ({mp.flag} is for {users})"


def missing_role(name: str, role: str) -> str:
    mp = MODEL_PARAMS[role]
    return f"strategy {name!r} needs {mp.what} (e.g. {mp.example}; in a run configuration: {mp.config})"


def check_keys(name: str, keys: list[str]) -> None:
    """Every key one the strategy accepts; else say what it does accept (or which strategy uses a model)."""
    ok, old = accepted(name), params_class(name).old_names()
    for new in set(old.values()):
        twice = [k for k in keys if k == new or old.get(k) == new]
        if len(twice) > 1 and not (new == "inner_max_nodes" and set(twice) == {"total_nodes", "lookup_tokens"}):
            raise BadInput(f"strategy {name!r} parameter {new} is given twice ({' and '.join(twice)}: one name now)")
    for key in keys:
        if key in ok or key in old:
            continue
        if key in MODEL_PARAMS:
            raise BadInput(unused_role(name, key))
        close = difflib.get_close_matches(key, [*ok, *old], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        takes = f"it accepts: {', '.join(ok)}" if ok else "it takes no parameters"
        raise BadInput(f"strategy {name!r} has no parameter {key!r}{hint} ({takes})")


def parse_params(name: str, values: dict[str, Any]) -> StrategyParams:
    """The strategy's (non-model) parameters validated; each problem one line naming strategy and parameter."""
    cls = params_class(name)
    check_keys(name, list(values))
    try:
        return cls.model_validate({k: v for k, v in values.items() if k not in MODEL_PARAMS})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0])
        msg = err["msg"]
        raise BadInput(f"strategy {name!r} parameter {key}={values.get(key)!r}: {msg[0].lower()}{msg[1:]}") from None

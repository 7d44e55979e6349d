"""Each strategy's parameters as one pydantic model: the one place their names and types are declared.

The command line (-p KEY=VALUE), a run configuration (records/config.py: `params`, chosen by `strategy`)
and make_strategy all validate with these models before any model is loaded, so a typo or a wrong type is
reported as the user's mistake, naming the strategy and the parameter, and a TypeError from inside a
strategy stays a bug. Model-valued parameters (a draft model, intermediate models) are roles: given by
flags or beside `params` in a configuration, declared by `roles`. Only the parameters given are passed on
(`given()`), so each strategy's own defaults apply (tests check the defaults here match them).
Torch-free: the harness and the configuration parser import it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


class StrategyParams(BaseModel):
    """Parameters of one strategy; `strategy` says which (the discriminator; never written out)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    roles: ClassVar[tuple[str, ...]] = ()  # model-valued parameters the strategy requires (MODEL_PARAMS)

    @classmethod
    def names(cls) -> list[str]:
        return [n for n in cls.model_fields if n != "strategy"]

    def given(self) -> dict[str, Any]:
        """The parameters set (validated and converted), in declaration order; defaults left to the strategy."""
        return {n: getattr(self, n) for n in self.names() if n in self.model_fields_set}


class ArParams(StrategyParams):
    strategy: Literal["ar"] = Field("ar", exclude=True)


class LookupParams(StrategyParams):
    strategy: Literal["lookup"] = Field("lookup", exclude=True)
    num_tokens: int | None = None  # None: 8
    max_ngram: int = 3
    min_ngram: int = 1
    draft_length: DraftLength = "adaptive"


class DraftParams(StrategyParams):
    strategy: Literal["draft"] = Field("draft", exclude=True)
    roles: ClassVar[tuple[str, ...]] = ("draft",)
    num_tokens: int = 4
    draft_length: DraftLength = "adaptive"
    share_prompt_kv: bool = True  # a draft of the target's own weights copies the prompt's cache entries


class EagleParams(StrategyParams):
    strategy: Literal["eagle"] = Field("eagle", exclude=True)
    head: Any = None  # a directory, an EagleHead, or None: the head shipped for the target
    top_k: int = 10
    depth: int = 3
    total_nodes: int | str = "auto"
    head_dtype: str | None = None
    draft_length: DraftLength = "adaptive"


class HierParams(StrategyParams):
    strategy: Literal["hier"] = Field("hier", exclude=True)
    roles: ClassVar[tuple[str, ...]] = ("intermediate",)
    drafter: str = "eagle"
    head: Any = None
    top_k: int = 10
    depth: int = 3
    total_nodes: int = 30
    min_chain: int | list[int] = 6
    max_chain: int = 10
    lookup_tokens: int = 10
    draft_length: DraftLength = "adaptive"
    share_prompt_kv: bool = True  # an intermediate of its verifier's own weights copies the prompt's cache entries


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
    ok = accepted(name)
    for key in keys:
        if key in ok:
            continue
        if key in MODEL_PARAMS:
            raise BadInput(unused_role(name, key))
        close = difflib.get_close_matches(key, ok, n=1)
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

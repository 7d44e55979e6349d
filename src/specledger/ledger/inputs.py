"""Cost inputs: the numbers a team knows (or can bound) about its hardware, task and people.

Any number may be a point value or a range `{low, mode, high}` (triangular; `mode` defaults
to the midpoint). The file is YAML; errors name the field and the line it is on. Values are typed strictly (a number
is written as one: `'3'` is text and `yes` a boolean, both refused) and finite (`.inf` refused). The file is read
within bounds (its size, its nesting, what its aliases expand to), so a hostile one is one line, quickly.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from specledger import bounded_yaml
from specledger.errors import BadInput

DEFAULT_COSTS = Path(__file__).with_name("default_costs.yaml")
WHAT = "cost inputs"
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Range(BaseModel):
    """A value known only within bounds; sampled as a triangular distribution."""

    model_config = _STRICT
    low: float
    mode: float | None = None
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.low > self.high:
            raise ValueError(f"low {self.low:g} > high {self.high:g}")
        if self.mode is not None and not (self.low <= self.mode <= self.high):
            raise ValueError(f"mode {self.mode:g} is outside [low {self.low:g}, high {self.high:g}]")
        return self

    @property
    def centre(self) -> float:
        return self.mode if self.mode is not None else (self.low + self.high) / 2


def _bounds(lo: float | None = 0.0, hi: float | None = None, *, lo_open: bool = False, what: str = "") -> AfterValidator:
    def check(v: float | Range | None) -> float | Range | None:
        if v is None:
            return v
        for x in (v.low, v.high) if isinstance(v, Range) else (v,):
            if lo is not None and (x < lo or (lo_open and x == lo)):
                raise ValueError(f"{x:g} is {'not above' if lo_open else 'below'} {lo:g}{what}")
            if hi is not None and x > hi:
                raise ValueError(f"{x:g} is above {hi:g}{what}")
        return v

    return AfterValidator(check)


Number = Annotated[
    Union[Annotated[float, Tag("value")], Annotated[Range, Tag("range")]],
    Discriminator(lambda v: "range" if isinstance(v, (dict, Range)) else "value"),
]
NonNeg = Annotated[Number, _bounds(0.0, what=" (must not be negative)")]
Positive = Annotated[Number, _bounds(0.0, lo_open=True, what=" (must be positive)")]
Fraction = Annotated[Number, _bounds(0.0, 1.0, lo_open=True, what=" (a fraction in (0, 1])")]


def _pass_rate(v: Number | None) -> Number | None:
    if v is None:
        return v
    lo, centre, hi = (v.low, v.centre, v.high) if isinstance(v, Range) else (v, v, v)
    if centre == 0 or hi == 0:
        raise ValueError("a pass rate of 0 means no attempt is ever accepted: the cost per accepted task is infinite")
    if lo < 0 or hi > 1:
        raise ValueError(f"{lo if lo < 0 else hi:g} is outside [0, 1]")
    return v


class _Section(BaseModel):
    model_config = _STRICT


class Hardware(_Section):
    kind: Literal["rented", "owned"] = "rented"
    device_count: Annotated[int, Field(ge=1)] | None = None  # devices per replica; None: as the run recorded (else 1)
    price_per_device_hour: NonNeg | None = None
    # rented: always_on (paid every hour, busy or not: a busy second costs price / utilisation) or
    # per_busy_second (serverless: only the seconds of work are paid; utilisation does not apply)
    billing: Literal["always_on", "per_busy_second"] = "always_on"
    purchase_price: NonNeg | None = None
    lifetime_years: Positive | None = None
    utilisation: Fraction | None = None  # share of the time the device is busy; rented always_on: default 1
    power_watts: NonNeg | None = None
    energy_price_per_kwh: NonNeg | None = None
    pue: Annotated[Number, _bounds(1.0, what=" (PUE is at least 1)")] | None = None
    use_measured_energy: bool = True

    @model_validator(mode="after")
    def _complete(self) -> Hardware:
        need = (
            ["price_per_device_hour"]
            if self.kind == "rented"
            else ["purchase_price", "lifetime_years", "utilisation", "power_watts", "energy_price_per_kwh", "pue"]
        )
        for name in need:
            if getattr(self, name) is None:
                raise ValueError(f"missing field '{name}' (needed when kind is {self.kind})")
        return self


class Tool(_Section):
    name: str
    calls: NonNeg = 1.0
    price: NonNeg = 0.0
    latency_s: NonNeg = 0.0


class Task(_Section):
    calls_per_task: Positive = 1.0
    tools: list[Tool] = Field(default_factory=list)


class Acceptance(_Section):
    retries: Annotated[int, Field(ge=0)]
    pass_rate: Annotated[Number, AfterValidator(_pass_rate)] | None = None
    review_minutes: NonNeg
    fix_minutes: NonNeg
    wage_per_hour: NonNeg


class Maintenance(_Section):
    engineering_hours_per_month: NonNeg = 0.0
    engineer_wage_per_hour: NonNeg | None = None  # None: the reviewers' wage
    retraining: bool | None = None  # None: only strategies with a trained draft head (eagle, hier)
    retraining_hours: NonNeg = 0.0
    retraining_device_hours: NonNeg = 0.0
    changes_per_year: NonNeg = 0.0


class Volume(_Section):
    tasks_per_month: Positive
    demand_rps: Positive | None = None


class Latency(_Section):
    ttft_p95_s: Annotated[float, Field(gt=0)] | None = None
    tpot_p95_s: Annotated[float, Field(gt=0)] | None = None
    e2e_p95_s: Annotated[float, Field(gt=0)] | None = None
    task_s: Annotated[float, Field(gt=0)] | None = None


class Human(_Section):
    """A person doing the task instead (the answer says where each configuration stands against it)."""

    minutes: NonNeg  # of a person's work per task
    wage_per_hour: NonNeg | None = None  # None: the reviewers' wage (acceptance.wage_per_hour)


class Resolved(_Section):
    """The inputs for one configuration (base file merged with that configuration's overrides)."""

    hardware: Hardware
    task: Task = Field(default_factory=Task)
    acceptance: Acceptance
    maintenance: Maintenance = Field(default_factory=Maintenance)
    volume: Volume
    latency: Latency = Field(default_factory=Latency)
    human: Human | None = None  # what a person doing the task costs, when known

    def central(self) -> dict:
        """Nested dict of plain numbers: ranges replaced by their mode (the point estimate)."""
        return central_values(self.model_dump())

    def ranges(self) -> dict[tuple, Range]:
        """Every ranged leaf, keyed by its path, e.g. ('acceptance', 'wage_per_hour')."""
        return {p: Range(**v) for p, v in leaves(self.model_dump()) if _is_range(v)}


class CostInputs(BaseModel):
    """The whole file: base inputs plus per-configuration overrides (`configs: {name: {section: {...}}}`)."""

    base: Resolved
    overrides: dict[str, dict] = Field(default_factory=dict)
    source: str = "<inputs>"
    # named variants of the whole file (`scenarios: {name: {section: {...}}}`), e.g. human-reviewed and fully
    # automated; the report prices each. The first is the headline.
    scenarios: dict[str, dict] = Field(default_factory=dict)

    def scenario(self, name: str) -> "CostInputs":
        """These inputs with one scenario's changes applied to the base (and no scenarios of their own)."""
        base = Resolved.model_validate(_merge(self.base.model_dump(exclude_none=True), self.scenarios[name]))
        return CostInputs(base=base, overrides=self.overrides, source=f"{self.source} [{name}]")

    def resolve(self, config: str) -> Resolved:
        over = self.overrides.get(config)
        if not over:
            return self.base
        merged = _merge(self.base.model_dump(exclude_none=True), over)
        return Resolved.model_validate(merged)


def _is_range(v: Any) -> bool:
    return isinstance(v, dict) and "low" in v and "high" in v


def central_values(d: Any) -> Any:
    """Nested inputs with each range {low, mode, high} replaced by its centre (the point estimate)."""
    if _is_range(d):
        return Range(**d).centre
    if isinstance(d, dict):
        return {k: central_values(v) for k, v in d.items()}
    return [central_values(v) for v in d] if isinstance(d, list) else d


def leaves(d: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, value) of every leaf of nested inputs, a range {low, mode, high} counting as one leaf."""
    if isinstance(d, (dict, list)) and not _is_range(d):
        for k, v in d.items() if isinstance(d, dict) else enumerate(d):
            yield from leaves(v, path + (k,))
    else:
        yield path, d


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and not _is_range(v) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _line_index(root: yaml.Node | None) -> dict[tuple, int]:
    """Path -> 1-based line of each key in the composed YAML, so errors can say where. A node an alias repeats is
    indexed once, under its first path (following every alias made a "billion laughs" file run until killed)."""
    lines: dict[tuple, int] = {}
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, tuple]] = [(root, ())] if root is not None else []
    while todo:
        node, path = todo.pop()
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                lines.setdefault(path + (k.value,), k.start_mark.line + 1)
                todo.append((v, path + (k.value,)))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((v, path + (i,)) for i, v in enumerate(node.value))
    return lines


def _bad(source: str, lines: dict[tuple, int], err: ValidationError, prefix: tuple = ()) -> BadInput:
    e = err.errors()[0]
    loc = tuple(x for x in e["loc"] if x not in ("value", "range") and not str(x).startswith("function-"))
    path = prefix + loc
    line = next((lines[path[:i]] for i in range(len(path), -1, -1) if path[:i] in lines), None)
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "missing":
        msg = "missing"
    elif e["type"] == "extra_forbidden":
        msg = "unknown field"
    elif e["type"] in ("float_type", "int_type", "bool_type", "string_type"):
        got = e["input"]
        hint = " (YAML reads yes/no/on/off as booleans)" if isinstance(got, bool) else \
            " (quoted, so YAML reads it as text)" if isinstance(got, str) and _numeric(got) else ""
        want = {"float_type": "a number", "int_type": "a whole number", "bool_type": "true or false",
                "string_type": "text"}[e["type"]]
        msg = f"expected {want}, got {type(got).__name__} {str(got)[:40]!r}{hint}"
    elif e["type"] == "finite_number":
        msg = f"must be a finite number, got {e['input']!r}"
    field = ".".join(str(p) for p in path) or "(top level)"
    where = f"{source}:{line}" if line else source
    return BadInput(f"{where}: {field}: {msg}")


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def parse_inputs(text: str, source: str = "<inputs>") -> CostInputs:
    root = bounded_yaml.compose(text, source, WHAT)  # (the schema nests 5 deep; a thousand tools fit in 1 MiB)
    raw = bounded_yaml.construct(text, root)
    if not isinstance(raw, dict):
        raise BadInput(f"{source}: expected a mapping of sections (hardware, task, acceptance, ...)")
    lines = _line_index(root)
    overrides = raw.pop("configs", None) or {}
    scenarios = raw.pop("scenarios", None) or {}
    if not isinstance(scenarios, dict) or not all(isinstance(v, dict) or v is None for v in scenarios.values()):
        raise BadInput(f"{source}:{lines.get(('scenarios',), '?')}: scenarios: expected {{name: {{section: "
                       "{field: value}}}} (an empty mapping {} for the inputs as written)")
    scenarios = {str(k): v or {} for k, v in scenarios.items()}
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        raise BadInput(f"{source}:{lines.get(('configs',), '?')}: configs: expected {{name: {{section: {{field: value}}}}}}")
    try:
        base = Resolved.model_validate(raw)
    except ValidationError as exc:
        raise _bad(source, lines, exc) from None
    inputs = CostInputs(base=base, overrides=overrides, source=source, scenarios=scenarios)
    for name in scenarios:
        try:
            inputs.scenario(name)
        except ValidationError as exc:
            raise _bad(source, lines, exc, ("scenarios", name)) from None
    for name, over in overrides.items():
        try:
            inputs.resolve(name)
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            from_override = _has_path(over, loc)
            raise _bad(source, lines, exc, ("configs", name) if from_override else ()) from None
    return inputs


def _has_path(d: Any, loc: tuple) -> bool:
    for k in loc:
        if isinstance(d, dict) and k in d:
            d = d[k]
        elif isinstance(d, list) and isinstance(k, int) and k < len(d):
            d = d[k]
        else:
            return False
    return True


def load_inputs(path: str | Path | None = None) -> CostInputs:
    """Read a cost file; None reads the documented default (`default_costs.yaml`)."""
    p = Path(path) if path is not None else DEFAULT_COSTS
    if not p.is_file():
        raise BadInput(f"{p}: cost inputs file not found (write an example with `specledger cost --init {p}`)")
    return parse_inputs(bounded_yaml.read_text(p, WHAT), str(p))


def example_text() -> str:
    """The commented example that `specledger cost --init` writes."""
    return DEFAULT_COSTS.read_text()

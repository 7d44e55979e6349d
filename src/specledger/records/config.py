"""Run configuration: configurations x workload x load, from a YAML/TOML file or CLI flags.

Everything that can change a figure lives here, so the resolved configuration is recorded
with the results.
"""

from __future__ import annotations

import string
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterable, Literal, Union

from pydantic import (
    AliasChoices, BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, ValidationInfo, field_serializer,
    field_validator, model_validator,
)

from specledger.decoding.params import (
    MODEL_PARAMS, PARAMS, STRATEGIES, ArParams, DraftParams, EagleParams, HierParams, LookupParams, OtherParams,
    StrategyParams, missing_role, parse_params, unused_role,
)

from specledger.records.pairing import Arm, baselines, precision_label, sampling_label
from specledger.engine.registry import TARGET_ALIASES, file_quantization
from specledger import bounded_yaml
from specledger.errors import BadInput, describe

if TYPE_CHECKING:
    from specledger.records.results import ConfigResult



class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    """A model in one role (draft, intermediate) with its own precision."""

    model: str
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    quant: Literal["none", "int8", "int4"] = "none"
    group_size: int = 32
    # bits of an activation inside the kernel's quantized products: 16 (~15-bit, two int8 digits) or 8 (llama.cpp's
    # one int8 digit: W4A8 / W8A8, a many-row product half the work; the quality gate says what it costs)
    activations: Literal[16, 8] = 16


class Sampling(_Strict):
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int = 0
    stop: list[str] = Field(default_factory=list)


PLACEHOLDERS = ("host", "port", "model", "model_path", "draft_model", "draft_model_path", "python", "run_dir",
                "llama_server")


def template_fields(command: str) -> list[str]:
    """Placeholder names used by a command template; unknown ones are a one-line error."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(command) if f is not None]
    except ValueError as exc:
        raise BadInput(f"server command {command!r}: {exc} (write literal braces as {{{{ }}}})") from None
    for n in names:
        if n not in PLACEHOLDERS:
            raise BadInput(f"server command: unknown placeholder {{{n}}} (known: "
                           f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    return names


class ServerSettings(_Strict):
    """A server specledger starts on a free port and stops itself (bench/managed.py), instead of a base_url.

    `command` is a template: {host} {port} {model} (the configuration's model) {model_path} (it resolved to a
    file) {draft_model} {draft_model_path} (`draft_model` below, e.g. llama-server's `-md`) {python} {run_dir}
    {llama_server} (the binary `make llama-server` built)."""

    command: str
    draft_model: str | None = None  # a second model the server loads (a registry name or a path)
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)  # default: a free port
    health: str | None = None  # health path; default /health, else /v1/models
    startup_timeout_s: float = Field(600.0, gt=0)
    stop_grace_s: float = Field(10.0, ge=0)
    env: dict[str, str] = Field(default_factory=dict)
    target: str | None = None  # the engine, for the lossless gate's grouping; default: the program's name

    @field_validator("command")
    @classmethod
    def _template(cls, v: str) -> str:
        try:
            template_fields(v)
        except BadInput as exc:
            raise ValueError(str(exc)) from None
        if not v.strip():
            raise ValueError("server command is empty")
        return v

    @model_validator(mode="after")
    def _draft(self) -> "ServerSettings":
        uses = {"draft_model", "draft_model_path"} & set(template_fields(self.command))
        if uses and self.draft_model is None:
            raise ValueError(f"the command uses {{{sorted(uses)[0]}}}: give the model in draft_model")
        if self.draft_model is not None and not uses:
            raise ValueError("draft_model is given but the command never uses {draft_model_path} or {draft_model}")
        return self

    def engine(self) -> str:
        """What the lossless gate groups by: `llama-server`, `python -m sglang.launch_server`, ..."""
        if self.target:
            return self.target
        words = self.command.split()
        prog = words[0].strip("{}").rsplit("/", 1)[-1]
        if prog.startswith("python") and "-m" in words[:-1]:
            prog += " -m " + words[words.index("-m") + 1]
        return prog


class OpenAISettings(_Strict):
    base_url: str = "http://127.0.0.1:8000"
    server: ServerSettings | None = None  # start this server (base_url then comes from its port)
    api: Literal["chat", "completions"] = "chat"
    model_name: str | None = None  # the "model" field sent; default: the configuration's model
    api_key_env: str | None = None  # name of the environment variable holding the key
    timeout_s: float = Field(300.0, gt=0)  # per request, whole stream
    connect_timeout_s: float = Field(10.0, gt=0)
    retries: int = Field(0, ge=0)  # a failed request (HTTP 5xx/429, timeout, dropped stream) sent again
    # A connection that fails before any byte of a response arrived (the server closed an idle keep-alive
    # connection as the request went out, or refused the connect) never reached the server: the request
    # is sent again at once on a fresh connection, up to this many times, and recorded as a transport retry.
    transport_retries: int = Field(3, ge=0)
    # Idle pooled connections are dropped after this many seconds, before common servers close them
    # (uvicorn, i.e. vLLM and SGLang: 5 s; llama.cpp: 5 s; nginx: 75 s), so few requests meet a stale one.
    keepalive_expiry_s: float = Field(2.0, ge=0)
    tokenizer: str | None = None  # tokenizer.json path or engine model name: counts tokens when usage is missing
    metrics_url: str | None = None  # Prometheus endpoint; default {base_url}/metrics
    # Many replicas. base_urls: requests go round robin over these (client side; base_url is then ignored) and
    # each one's /metrics is scraped. metrics_urls: base_url is a load balancer; scrape these per-replica
    # endpoints instead (through a balancer a scrape samples one random replica). Counters are summed.
    base_urls: list[str] = Field(default_factory=list)
    metrics_urls: list[str] = Field(default_factory=list)
    scrape_metrics: bool = True
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v, "base_url")

    @field_validator("base_urls", "metrics_urls")
    @classmethod
    def _urls(cls, v: list[str], info: ValidationInfo) -> list[str]:
        out = [_http_url(u, str(info.field_name)) for u in v]
        if len(set(out)) != len(out):
            raise ValueError(f"{info.field_name} names a replica twice: {out}")
        return out

    def replicas(self) -> list[str]:
        """The base URLs requests go to, in round-robin order."""
        return self.base_urls or [self.base_url]


def _http_url(v: str, field: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"{field} must start with http:// or https:// (got {v!r})")
    return v.rstrip("/").removesuffix("/v1")


def _params_tag(v: Any) -> str:
    if isinstance(v, OtherParams):
        return "other"
    strategy = v.get("strategy") if isinstance(v, dict) else getattr(v, "strategy", None)
    return strategy if strategy in PARAMS else "other"


# A configuration's strategy parameters: the model of its strategy (decoding/params.py), chosen by `strategy`.
Params = Annotated[
    Union[Annotated[ArParams, Tag("ar")], Annotated[LookupParams, Tag("lookup")], Annotated[DraftParams, Tag("draft")],
          Annotated[EagleParams, Tag("eagle")], Annotated[HierParams, Tag("hier")], Annotated[OtherParams, Tag("other")]],
    Discriminator(_params_tag),
]


class BenchConfig(_Strict):
    """One decoding configuration to measure."""

    name: str
    backend: Literal["inprocess", "openai"] = "inprocess"
    model: str = "smollm2-135m"
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    quant: Literal["none", "int8", "int4"] = "none"
    group_size: int = 32
    activations: Literal[16, 8] = 16  # as ModelSpec's
    device: str = "cpu"
    strategy: str = "ar"
    params: Params = Field(default_factory=dict, validate_default=True)
    draft: ModelSpec | None = None
    intermediate: ModelSpec | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    # (max_new_tokens: the old spelling, still read from config files and run.json)
    max_tokens: int = Field(128, ge=1, validation_alias=AliasChoices("max_tokens", "max_new_tokens"))
    openai: OpenAISettings | None = None
    optional: bool = False  # cannot start (e.g. a strategy not in this build): skip it with a note, run the rest
    # in-process: continuous batching (concurrency N = N sequences in one pass, up to max_batch); false = one
    # request at a time (max_batch 1: the others queue)
    batching: bool | None = None
    max_batch: int = Field(16, ge=1)  # in-process batching: sequences in one pass at most (more wait)
    prefill_chunk: int = Field(256, ge=1)  # in-process batching: prompt rows per pass at most (ITL vs TTFT)
    prefix_cache: bool = True  # in-process batching: a prompt reuses the cache of an earlier request's tokens

    @field_validator("params", mode="before")
    @classmethod
    def _typed_params(cls, v: Any, info: ValidationInfo) -> Any:
        """A mapping (a file, the flags, an old run.json) becomes the strategy's parameter model here, so a
        typo fails at parse time naming the strategy and the parameter."""
        if isinstance(v, StrategyParams) or not isinstance(v, dict):
            return v
        strategy, backend = info.data.get("strategy", "ar"), info.data.get("backend", "inprocess")
        if backend != "inprocess" or strategy not in PARAMS:  # a server's strategy (or unknown: said below)
            return OtherParams.model_validate({**v, "strategy": strategy})
        for key in v:
            if key in MODEL_PARAMS:
                raise ValueError(f"{unused_role(strategy, key)}" if key not in PARAMS[strategy].roles else
                                 f"give {MODEL_PARAMS[key].what} beside params, not in them "
                                 f"({MODEL_PARAMS[key].config})")
        try:
            return parse_params(strategy, v)
        except BadInput as exc:
            raise ValueError(str(exc)) from None

    @field_serializer("params")
    def _given(self, v: StrategyParams) -> dict[str, Any]:
        """Written as given (a plain mapping, as run.json has always held)."""
        return v.given()

    @model_validator(mode="after")
    def _check(self) -> "BenchConfig":
        if self.backend == "inprocess" and self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r} (known: {', '.join(STRATEGIES)})")
        if self.backend == "openai" and self.openai is None:
            self.openai = OpenAISettings()
        if self.backend == "inprocess" and self.openai is not None:
            raise ValueError("'openai' settings given for an inprocess backend")
        if self.batching and self.backend != "inprocess":
            raise ValueError("batching is an in-process setting (the server batches on its own)")
        if self.backend == "inprocess":
            uses = PARAMS[self.strategy].roles
            for role in MODEL_PARAMS:
                if role in uses and getattr(self, role) is None:
                    raise ValueError(missing_role(self.strategy, role))
                if role not in uses and getattr(self, role) is not None:
                    raise ValueError(unused_role(self.strategy, role))
            if _params_tag(self.params) != self.strategy:  # built in code with another strategy's parameters
                raise ValueError(f"params for strategy {_params_tag(self.params)!r} given to strategy "
                                 f"{self.strategy!r}")
        for spec in (self.draft, self.intermediate):
            if spec is not None and spec.model in TARGET_ALIASES:
                spec.model = self.model  # resolved once: recorded and keyed as the model it is
        return self

    @property
    def target(self) -> ModelSpec:
        """The target model with its precision (the role the strategy speeds up)."""
        return ModelSpec(model=self.model, dtype=self.dtype, quant=self.quant, group_size=self.group_size,
                         activations=self.activations)

    @property
    def batch_size(self) -> int:
        """Sequences the in-process backend decodes in one pass at most (1: one request at a time)."""
        return 1 if self.batching is False else self.max_batch

    @property
    def greedy(self) -> bool:
        return self.sampling.temperature == 0.0


class WorkloadSettings(_Strict):
    spec: str = "builtin-quick"
    categories: list[str] | None = None
    per_category: int | None = Field(None, ge=1)
    sample: int | None = Field(None, ge=1)  # a seeded random sample of this many (reservoir: streams)
    limit: int | None = Field(None, ge=1)
    seed: int = 0
    on_bad_line: Literal["stop", "skip"] = "stop"
    grader: str | None = None  # user grader "module:function"
    kind: Literal["multi_turn", "translation", "summarization", "qa", "math", "rag", "code"] | None = None  # for records
    # that carry no task kind (ShareGPT, chat, CSV, text, traces); default multi_turn (traces: summarization)
    prompt_column: str | None = None  # CSV: the column holding the prompt (default: detected from the header)



class SteadyStateSettings(_Strict):
    """Hold a level past its planned requests until throughput is steady (bench/steady.py), or until
    `duration_s` or `max_requests` ends it first."""

    window: int = Field(8, ge=2)  # completed requests per window
    tolerance: float = Field(0.1, gt=0)  # how far the fitted slope may move throughput across the span, relative
    span: int = Field(2, ge=2)  # windows the slope is fitted over
    max_requests: int = Field(256, ge=1)
    duration_s: float | None = Field(None, gt=0)  # --sustain: the longest a level is held


class LoadSettings(_Strict):
    concurrency: list[int] | None = None  # closed loop: N in flight (a sweep when several)
    rate: list[float] | None = None  # open loop: Poisson arrivals, requests/s
    replay: list[float] | None = None  # a timed trace at its own arrival times, sped up by each factor
    num_requests: int | None = Field(None, ge=1)  # conversations per level; default: the whole workload
    warmup: int = Field(1, ge=0)  # conversations run first and not counted
    # shorter warm-up answers (they only prime the caches); warmup_max_new_tokens: the old spelling, still read
    warmup_max_tokens: int | None = Field(None, ge=1, validation_alias=AliasChoices("warmup_max_tokens",
                                                                             "warmup_max_new_tokens"))
    max_in_flight: int = Field(1024, ge=1)  # open loop safety bound
    steady_state: SteadyStateSettings | None = None

    @model_validator(mode="after")
    def _one(self) -> "LoadSettings":
        if sum(bool(x) for x in (self.concurrency, self.rate, self.replay)) > 1:
            raise ValueError("give either concurrency or rate or replay (one load kind), not several")
        if not self.concurrency and not self.rate and not self.replay:
            self.concurrency = [1]
        for values, message in ((self.concurrency, "concurrency must be >= 1 (got {})"),
                                (self.rate, "rate must be > 0 requests/s (got {})"),
                                (self.replay, "replay speed must be > 0 (got {}; 1 = the trace's own times)")):
            bad = next((x for x in values or [] if x <= 0), None)  # (concurrency: an integer, so < 1)
            if bad is not None:
                raise ValueError(message.format(bad))
        return self

    def levels(self) -> list[LoadLevel]:
        """The load levels in sweep order."""
        if self.replay:
            return [LoadLevel(f"replay={r:g}x", replay=r) for r in self.replay]
        if self.rate:
            return [LoadLevel(f"r={r:g}", rate=r) for r in self.rate]
        return [LoadLevel(f"c={c}", concurrency=c) for c in self.concurrency or [1]]


@dataclass(frozen=True)
class LoadLevel:
    """One load level: closed loop (concurrency), open loop (rate, requests/s) or a trace replay (speed)."""

    label: str
    concurrency: int | None = None
    rate: float | None = None
    replay: float | None = None


class SLO(_Strict):
    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)
    e2e_s: float | None = Field(None, gt=0)


class GateSettings(_Strict):
    lossless_min_share: float = Field(1.0, ge=0.0, le=1.0)  # share of greedy outputs identical to `ar`
    # bf16/fp16 targets: a k-token pass and k one-token passes round differently, so near-ties flip and some
    # greedy outputs diverge without any bug; the gate's figures still show every divergence.
    lossless_min_share_16bit: float = Field(0.5, ge=0.0, le=1.0)
    min_pass_rate: float | None = Field(None, ge=0.0, le=1.0)
    # Quantization: in-process targets other than fp32 are compared with the fp32 model, teacher-forced
    # over the package's quality text (bench/probes.py); below min_agreement they are not comparable.
    quantization: bool = True
    min_agreement: float = Field(0.95, ge=0.0, le=1.0)  # top-1 agreement (bf16 alone reaches ~0.98 on SmolLM2)
    max_kl: float | None = Field(None, ge=0.0)  # mean KL(reference || candidate), nats
    # Failed requests (after retries) above this share of a configuration's requests: not comparable.
    max_failure_rate: float = Field(0.05, ge=0.0, le=1.0)


class QualitySettings(_Strict):
    """A graded workload run once per target and precision (label "quality"): the pass rate with power (n items:
    a 95% interval of about +-1/sqrt(n)). Speculative configurations are lossless, so they share the pass rate
    of the greedy autoregressive configuration of their target. Its items are not timed for the ledger, so they
    run `concurrency` at a time: a continuously batched configuration decodes that many in one pass (greedy
    fp32 outputs in a batch are token-identical to alone; 16-bit ones may round differently at near-ties, as
    they do between a k-token verification and k one-token passes)."""

    spec: str = "builtin-graded"
    limit: int | None = Field(None, ge=1)
    sample: int | None = Field(None, ge=1)  # a seeded random sample of the graded items (e.g. 40 of HumanEval's 164)
    seed: int = 0
    concurrency: int = Field(16, ge=1)


QUALITY_LEVEL = "quality"


class RetrySettings(_Strict):
    """A measured retry loop (bench/retry.py): a graded answer that fails is asked again, up to `attempts` in
    all, the later ones sampled at `temperature` with seed `seed` + 1000 x item + attempt; `feedback`: the next
    prompt carries the failed answer and the grader's message (a code task's failing test). Runs on the levels
    whose grades price a configuration: the quality level when the run has one, else every level. Every
    attempt's device seconds and tokens are recorded with the item; a task no attempt passes is escalated."""

    attempts: int = Field(3, ge=1)
    temperature: float = Field(0.8, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    seed: int = 0
    feedback: bool = False


class RunConfig(_Strict):
    configs: list[BenchConfig] = Field(min_length=1)
    workload: WorkloadSettings = Field(default_factory=WorkloadSettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    slo: SLO | None = None
    gates: GateSettings = Field(default_factory=GateSettings)
    output_dir: str = "runs"
    run_id: str | None = None
    seed: int = 0
    bootstrap: int = Field(1000, ge=0)  # resamples for confidence intervals (0: none)
    verify_curve: bool = True  # measure each in-process target's forward time for 1..64 new tokens (seconds)
    # Interleaving: every configuration is started at once (in-process ones share loaded weights) and one-at-a-time
    # levels (concurrency 1) run request by request, each block (one item under every configuration) in a seeded
    # random order, so drift in machine load hits all configurations alike. Other levels run configuration by
    # configuration in a seeded random order. false: one configuration after another, as listed.
    interleave: bool = True
    repeats: int = Field(1, ge=1)  # passes over the workload per load level (paired statistics pool them)
    quality: QualitySettings | None = None
    retry: RetrySettings | None = None  # a measured retry loop on graded failures (None: the ledger's formula)
    calibration: bool = True  # time a fixed matrix product before, during and after the run (bench/calibration.py)
    # torch threads for in-process configurations; None: chosen by a short probe of the targets at 1, 2, ...
    # threads before the run (bench/threads.py), recorded with the run either way
    threads: int | None = Field(None, ge=1)
    # power of one busy logical CPU (W) for the energy estimate where the machine has no counter (RAPL, NVML);
    # None: a table of known CPUs (bench/energy.py), or $SPECLEDGER_CPU_WATTS
    cpu_watts: float | None = Field(None, gt=0)

    def quality_source(self, bc: BenchConfig) -> str | None:
        """Which configuration's quality level stands for bc's (None: no quality level in this run)."""
        if self.quality is None:
            return None
        if bc.greedy and bc.strategy != "ar":
            return config_baselines(self.configs).get(bc.name, bc.name)
        return bc.name

    @model_validator(mode="after")
    def _unique(self) -> "RunConfig":
        names = [c.name for c in self.configs]
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise ValueError(f"two configurations named {twice!r}")
        return self


def parse_run_config(data: Any, *, source: str = "config") -> RunConfig:
    """Validate a mapping; any problem becomes one line naming the field."""
    if not isinstance(data, dict):
        raise BadInput(f"{source}: expected a mapping at the top level")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise BadInput(f"{source}: {describe(exc)}") from None


def load_run_config(path: str | Path) -> RunConfig:
    path = Path(path)
    if not path.exists():
        raise BadInput(f"config file {path} does not exist")
    text, toml = bounded_yaml.read_text(path, "run configurations"), path.suffix == ".toml"
    if not toml:  # bounded: nesting, aliases (50,000 nested brackets were a RecursionError)
        return parse_run_config(bounded_yaml.load(text, str(path), "run configurations"), source=str(path))
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        first = str(exc).strip().splitlines()
        raise BadInput(f"{path}: not valid TOML: {' '.join(first[:1])}") from None
    except RecursionError:
        raise BadInput(f"{path}: nested too deep to be a run configuration") from None
    return parse_run_config(data, source=str(path))


# ---- pairing (records/pairing.py's rule) over configurations and recorded results ----

def _where(backend: str, device: str, openai: OpenAISettings | None) -> str:
    if openai is None:
        return device if backend == "inprocess" else ""
    return f"managed:{openai.server.engine()}" if openai.server else openai.base_url


def served_precision(openai: OpenAISettings | None, model: str) -> str:
    """A server arm's precision is what the server runs, not the dtype and quant the in-process engine would load
    (a server ignores them): the GGUF file's quantization where the run starts a server that reads the file
    ({model_path}: llama-server's Q4_K_M), else "as served"."""
    if openai is not None and openai.server is not None and "{model_path}" in openai.server.command:
        return file_quantization(model) or "as served"
    return "as served"


def config_precision(bc: BenchConfig) -> str:
    if bc.backend == "openai":
        return served_precision(bc.openai, bc.model)
    return precision_label(bc.dtype, bc.quant, bc.group_size, bc.activations)


def config_arm(bc: BenchConfig) -> Arm:
    return Arm(bc.name, bc.strategy, bc.backend, _where(bc.backend, bc.device, bc.openai), bc.model,
               config_precision(bc), sampling_label(bc.sampling))


def config_baselines(configs: Iterable[BenchConfig]) -> dict[str, str]:
    return baselines(config_arm(bc) for bc in configs)


def result_arm(cr: ConfigResult) -> Arm:
    """From the configuration run.json recorded (its spec); where that does not parse (an import, a spec from
    another version), where and sampling stay unknown ("")."""
    spec: dict[str, Any] = cr.spec or {}
    try:
        openai = OpenAISettings.model_validate(spec["openai"]) if spec.get("openai") else None
        where = _where(cr.backend, str(spec.get("device", "")), openai)
        sampling = sampling_label(Sampling.model_validate(spec.get("sampling") or {})) if spec else ""
    except (ValidationError, TypeError, ValueError):
        openai, where, sampling = None, "", ""
    precision = (served_precision(openai, cr.model) if cr.backend == "openai"
                 else precision_label(cr.dtype, cr.quant, cr.group_size, int(spec.get("activations") or 16)))
    return Arm(cr.name, cr.strategy, cr.backend, where, cr.model, precision, sampling)


def result_baselines(configs: Iterable[ConfigResult]) -> dict[str, str]:
    return baselines(result_arm(cr) for cr in configs)

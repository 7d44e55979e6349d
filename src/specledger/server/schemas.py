"""Request bodies of the OpenAI-compatible endpoints, and the OpenAI-style error body.

Fields the engine cannot honour (n > 1, logprobs, penalties, tools, a response_format other than
text, ...) are rejected with a 400 that names the field rather than silently ignored; OpenAI fields
that change nothing here (`user`, `metadata`, `store`, ...) are accepted and ignored; any other field
is refused (a typo such as `max_token` would otherwise mean "no limit"). Values are strict: a number
must be a JSON number (an integer where an integer is asked), a flag a JSON boolean. The seed must
be one a generator takes: [-2^63, 2^64 - 1] (as vLLM, a seed outside is refused, not reduced: two
different seeds silently sharing one stream would be a wrong answer, not a convenience).
Extensions as in vLLM: `top_k`, `min_tokens`, `ignore_eos`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes
STRICT = ConfigDict(extra="forbid", strict=True)


class ApiError(Exception):
    """An error answered as {"error": {message, type, param, code}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False
    include_obfuscation: bool | None = None  # (OpenAI's; nothing to obfuscate here)
    continuous_usage_stats: bool | None = None  # (vLLM's, sent by GuideLLM: usage on every chunk; the last has it)


class ResponseFormat(BaseModel):
    """Only plain text: JSON modes would need constrained decoding, which the engine does not have."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, v: str) -> str:
        if v != "text":
            raise ValueError(f"only {{'type': 'text'}} is supported (got {v!r})")
        return v


class _Sampling(BaseModel):
    """What both endpoints share: the model, sampling, stops, streaming."""

    model_config = STRICT

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # -1 or 0: off
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: list[str] = Field(default_factory=list, max_length=4)
    stream: bool = False
    stream_options: StreamOptions | None = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    # Accepted only at their neutral values: the engine does not implement them.
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    # OpenAI fields that change nothing here: accepted, ignored.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _stop_text(cls, v: list[str]) -> list[str]:
        for x in v:
            _unicode(x)
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float) -> float:
        if v != 0:
            raise ValueError("penalties are not supported (only 0)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict | None) -> dict | None:
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _logprobs(cls, v: Any) -> Any:
        if v is not None and v is not False and v != 0:
            raise ValueError("logprobs are not supported")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


def _unicode(v: str) -> str:
    """Text the tokenizer can encode: a lone surrogate (JSON "\\ud800") is not text."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text: a lone surrogate {v[exc.start]!r} at character {exc.start}") \
            from None
    return v


def _text_content(v: Any) -> Any:
    """Message content: a string, or a list of {"type": "text", "text": ...} parts joined."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        texts = []
        for part in v:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError("content must be a string or a list of text parts")


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None  # (a participant's name: not part of the chat template here)
    # What an assistant message of an earlier answer carries when a client sends it back: only empty.
    refusal: None = None
    tool_calls: list[Any] | None = None
    function_call: None = None
    audio: None = None
    annotations: list[Any] | None = None

    @field_validator("tool_calls", "annotations")
    @classmethod
    def _empty(cls, v: list | None) -> list | None:
        if v:
            raise ValueError("tool calls are not supported")
        return v

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any) -> Any:
        return _text_content(v)

    @field_validator("content")
    @classmethod
    def _content_text(cls, v: str) -> str:
        return _unicode(v)

    def as_dict(self) -> dict[str, str]:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content}


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    tools: list[Any] | None = None
    tool_choice: Any = None  # only "none" (or absent): there are no tools
    parallel_tool_calls: bool | None = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list | None) -> list | None:
        if v:
            raise ValueError("tools are not supported")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        if v not in (None, "none", "auto"):
            raise ValueError("tools are not supported")
        return v

    @property
    def max_tokens_asked(self) -> int | None:  # max_completion_tokens or max_tokens (None: not given)
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        # OpenAI also takes a batch (a list of prompts); one prompt per request here.
        if isinstance(v, list) and v and all(isinstance(x, (str, list)) for x in v):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
            v = v[0]
        ids = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        if not isinstance(v, str) and not ids:
            raise ValueError("a prompt must be a string or a list of token ids")
        return _unicode(v) if isinstance(v, str) else v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    @property
    def max_tokens_asked(self) -> int | None:  # (None: not given)
        return self.max_tokens

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

import json
from typing import Annotated, Any, Callable, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

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


async def send_error(send: Callable, status: int, message: str, code: str, header: tuple[bytes, bytes]) -> None:
    """An error answered by ASGI middleware, before any route (or the body's parsing) runs."""
    body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), header]})
    await send({"type": "http.response.body", "body": body})


def _only(ok: Callable[[Any], bool], message: str) -> AfterValidator:
    """A field the engine honours only at its neutral values: any other is refused, naming the field."""
    def check(v: Any) -> Any:
        if not ok(v):
            raise ValueError(message)
        return v
    return AfterValidator(check)


def _unicode(v: str) -> str:
    """Text the tokenizer can encode: a lone surrogate (JSON "\\ud800") is not text."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text: a lone surrogate {v[exc.start]!r} at character {exc.start}") \
            from None
    return v


_NO_PENALTY = _only(lambda v: v == 0, "penalties are not supported (only 0)")
_NO_LOGPROBS = _only(lambda v: v is None or v is False or v == 0, "logprobs are not supported")
_NO_TOOL_CALLS = _only(lambda v: not v, "tool calls are not supported")
_NO_TOOLS = "tools are not supported"


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
    stop: Annotated[list[str], BeforeValidator(lambda v: [] if v is None else [v] if isinstance(v, str) else v),
                    AfterValidator(lambda v: [_unicode(x) for x in v])] = Field(default_factory=list, max_length=4)
    stream: bool = False
    stream_options: StreamOptions | None = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    # Accepted only at their neutral values: the engine does not implement them.
    n: Annotated[int, _only(lambda v: v == 1, "only n=1 is supported")] = 1
    presence_penalty: Annotated[float, _NO_PENALTY] = 0.0
    frequency_penalty: Annotated[float, _NO_PENALTY] = 0.0
    logit_bias: Annotated[dict[str, float] | None, _only(lambda v: not v, "logit_bias is not supported")] = None
    logprobs: Annotated[Any, _NO_LOGPROBS] = None
    top_logprobs: Annotated[int | None, _NO_LOGPROBS] = None
    response_format: ResponseFormat | None = None
    # OpenAI fields that change nothing here: accepted, ignored.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def max_tokens_asked(self) -> int | None:  # max_completion_tokens (chat's newer name) or max_tokens (None: neither)
        return getattr(self, "max_completion_tokens", None) or self.max_tokens


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
    content: Annotated[str, BeforeValidator(_text_content), AfterValidator(_unicode)]
    name: str | None = None  # (a participant's name: not part of the chat template here)
    # What an assistant message of an earlier answer carries when a client sends it back: only empty.
    refusal: None = None
    tool_calls: Annotated[list[Any] | None, _NO_TOOL_CALLS] = None
    function_call: None = None
    audio: None = None
    annotations: Annotated[list[Any] | None, _NO_TOOL_CALLS] = None

    def as_dict(self) -> dict[str, str]:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content}


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    tools: Annotated[list[Any] | None, _only(lambda v: not v, _NO_TOOLS)] = None
    # only "none" or "auto" (or absent): there are no tools
    tool_choice: Annotated[Any, _only(lambda v: v in (None, "none", "auto"), _NO_TOOLS)] = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    echo: Annotated[bool, _only(lambda v: not v, "echo is not supported")] = False
    best_of: Annotated[int | None, _only(lambda v: v in (None, 1), "only best_of=1 is supported")] = None
    suffix: Annotated[str | None, _only(lambda v: not v, "suffix is not supported")] = None

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

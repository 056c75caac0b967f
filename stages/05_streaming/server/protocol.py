"""The request bodies the server accepts, typed, and the one place where a body is checked.

`parse_request` turns raw bytes into a validated request model or raises `APIError`:
JSON syntax, nesting depth and Unicode first (body.py), then the pydantic model (strict types,
no unknown fields: a typo is an error, not a silently ignored field), then the value
ranges, which are `SamplingParams`'s own checks. OpenAI fields this server does not
implement are refused by name unless they carry their "off" value. ``n`` samples share the
prompt's KV blocks (stage 03's forks); the penalties and constraints are vLLM's. Structured
output (OpenAI's ``response_format``, vLLM's ``structured_outputs``) becomes
``SamplingParams.structured_outputs``, which only stage 07's engine applies (the others refuse it). The model's
fields become `SamplingParams` in params.py.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .body import from_validation_error, parse_json
from .errors import APIError

# OpenAI fields that are not implemented, each with the values that mean "off" (those are accepted).
UNSUPPORTED = {"best_of": (1,), "suffix": ("",),
               "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
               "audio": (), "modalities": (["text"],),
               "reasoning_effort": (), "web_search_options": ()}
MAX_N = 128  # OpenAI's limit on n: each sample is a sequence of its own in the engine
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}  # no effect on the output
# vLLM's old structured-output fields: removed in vLLM 0.12, where they are since ignored (the request then runs
# unconstrained). Here they are refused, naming what replaced them.
LEGACY_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar", "guided_decoding_backend": None, "guided_whitespace_pattern": None}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool | None = None


class JsonSchemaFormat(Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for the name
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is enforced either way
    description: str | None = None


class ResponseFormat(Strict):
    """OpenAI's response_format: text (no constraint), json_object (any JSON object) or json_schema."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(Strict):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: Any = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    allowed_token_ids: list[int] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: dict | None = None  # vLLM's: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)):
            return v
        raise ValueError("must be a string or a list of strings")


class CompletionRequest(SamplingFields):
    prompt: Any
    logprobs: int | None = None  # the legacy API's: how many most likely tokens to list with each token
    echo: bool | None = None  # the prompt comes back before the completion (with logprobs: the prompt's too)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]  # a batch of one
        if isinstance(v, str) or (isinstance(v, list) and all(type(t) is int for t in v)):
            return v
        raise ValueError("must be a string or a list of token ids (one prompt per request)")


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: Any

    @field_validator("content")
    @classmethod
    def _content(cls, v):
        return text_content(v)


def text_content(v) -> str:
    """A message's (or a prediction's) content as text: a string, or OpenAI's list of text parts."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        try:
            return "\n".join(TextPart.model_validate(part).text for part in v)
        except ValidationError:
            pass
    raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts')


class Prediction(Strict):
    """OpenAI's predicted outputs: text the answer is expected to repeat (stage 06 drafts from it)."""
    type: Literal["content"]
    content: Any

    @field_validator("content")
    @classmethod
    def _content(cls, v):
        return text_content(v)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    prediction: Prediction | None = None


def parse_request(raw: bytes, model: type[Strict]) -> Strict:
    """Raw body -> a validated request, or an `APIError` (400) naming the field that is wrong."""
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, off in UNSUPPORTED.items():
        value = body.pop(name, None)
        if value is not None and not any(type(value) is type(o) and value == o for o in off):
            raise APIError(400, f"{name} is not supported by this server; leave it out", name)
    for name in IGNORED:
        body.pop(name, None)
    for name, kind in LEGACY_GUIDED.items():
        if name in body:
            instead = f'structured_outputs: {{"{kind}": ...}}' if kind else "structured_outputs"
            raise APIError(400, f"{name} was removed from vLLM's API (0.12) and is not read here: send {instead} "
                                "instead", name)
    try:
        request = model.model_validate(body)
    except ValidationError as e:
        raise from_validation_error(e) from None
    if request.n is not None and not 1 <= request.n <= MAX_N:
        raise APIError(400, f"n={request.n} is invalid: must be an integer in [1, {MAX_N}]", "n")
    if request.stream_options is not None and not request.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
    return request

"""The request bodies the server accepts, typed, and the one place where a body is checked.

`parse_request` turns raw bytes into a validated request model or raises `APIError`:
JSON syntax, nesting depth and Unicode first, then the pydantic model (strict types,
no unknown fields: a typo is an error, not a silently ignored field), then the value
ranges, which are `SamplingParams`'s own checks. OpenAI fields this server does not
implement are refused by name unless they carry their "off" value. ``n`` samples share the
prompt's KV blocks (stage 03's forks); the penalties and constraints are vLLM's. Structured
output (OpenAI's ``response_format``, vLLM's ``structured_outputs``) becomes
``SamplingParams.structured_outputs``, which only stage 07's engine applies (the others refuse it).
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from common.sampling import SamplingParams
from common.validate import InvalidParam, check_text, clip

from .errors import APIError

# A chat body is 5 levels deep (messages -> message -> content -> part -> text), but a JSON schema in
# response_format carries its own nesting: two levels per nested object (properties -> name), 60-some for the
# 30-level schemas of JSONSchemaBench's deepest splits. Stage 07 bounds a schema by its own depth (64 subschemas,
# stages/07_structured/rewrites.py); this guard only keeps a parser's stack bounded.
MAX_DEPTH = 256
# OpenAI fields that are not implemented, each with the values that mean "off" (those are accepted).
UNSUPPORTED = {"best_of": (1,), "suffix": ("",),
               "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
               "audio": (), "modalities": (["text"],),
               "reasoning_effort": (), "web_search_options": ()}
MAX_N = 128  # OpenAI's limit on n: each sample is a sequence of its own in the engine
PENALTIES = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
             "allowed_token_ids")  # passed to SamplingParams as they are (logit_bias: its keys become ids)
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


def sampling_params(req: SamplingFields, chat: bool, prompt_len: int, max_model_len: int) -> SamplingParams:
    """The request's SamplingParams; like vLLM, a prompt plus max_tokens beyond the context is an error."""
    room = max_model_len - prompt_len
    if room < 1:
        raise APIError(400, f"the prompt has {prompt_len} tokens and this model's context is {max_model_len}: "
                            f"shorten it to at most {max_model_len - 1} tokens", "messages" if chat else "prompt")
    name = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
    requested = getattr(req, name)
    kwargs = {f: getattr(req, f) for f in ("temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
                                           "ignore_eos", "n", *PENALTIES) if getattr(req, f) is not None}
    if chat and req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs: true", "top_logprobs")
    if chat and req.logprobs:
        kwargs["logprobs"] = 0 if req.top_logprobs is None else req.top_logprobs
    elif not chat and req.logprobs is not None:
        kwargs["logprobs"] = req.logprobs
        if req.echo:  # a text's log-likelihood: every prompt token's log-probability, scored as vLLM does
            kwargs["prompt_logprobs"] = req.logprobs
    if chat and req.prediction is not None:
        kwargs["prediction"] = req.prediction.content
    structured = structured_outputs(req)
    if structured is not None:
        kwargs["structured_outputs"] = structured
    if req.logit_bias is not None:  # JSON keys are strings: OpenAI's token ids in decimal
        if not all(k.isascii() and k.isdigit() and len(k) < 10 for k in req.logit_bias):
            raise APIError(400, "logit_bias: every key must be a token id written in decimal, like \"50256\"",
                           "logit_bias")
        kwargs["logit_bias"] = {int(k): v for k, v in req.logit_bias.items()}
    try:
        params = SamplingParams(max_tokens=min(256 if chat else 16, room) if requested is None else requested,
                                **kwargs)
    except InvalidParam as e:
        param = name if e.param == "max_tokens" else "top_logprobs" if e.param == "logprobs" and chat else e.param
        if e.param == "structured_outputs" and req.structured_outputs is None:
            param = "response_format"
        raise APIError(400, str(e).replace("SamplingParams.max_tokens", param).replace("SamplingParams.", ""),
                       param) from None
    if requested is not None and requested > room:
        raise APIError(400, f"{name}={requested} is too large: the context holds {max_model_len} tokens and the "
                            f"prompt has {prompt_len}, so at most {room} can be generated", name)
    return params


def structured_outputs(req: SamplingFields) -> dict | None:
    """The request's constraint as StructuredOutputsParams' fields: vLLM's structured_outputs, or OpenAI's
    response_format (json_schema: its schema; json_object: any object); never both."""
    fmt = req.response_format if req.response_format is not None and req.response_format.type != "text" else None
    if fmt is not None and req.structured_outputs is not None:
        raise APIError(400, "give response_format or structured_outputs, not both", "structured_outputs")
    if fmt is None:
        return req.structured_outputs
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(400, 'response_format of type "json_schema" needs json_schema: {"name": ..., "schema": {...}}',
                       "response_format")
    return {"json": fmt.json_schema.schema_}


def parse_json(raw: bytes):
    try:
        body = json.loads(raw, parse_constant=reject_constant)
    except RecursionError:
        raise APIError(400, f"the request body is nested too deeply (the limit is {MAX_DEPTH} levels)") from None
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not UTF-8 text") from None
    except ValueError as e:  # JSONDecodeError, NaN or Infinity, an integer of more than 4,300 digits
        raise APIError(400, f"the request body is not valid JSON: {clip(str(e), 160)}") from None
    check_tree(body)
    return body


def reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def check_tree(body) -> None:
    """No string (key or value) may hold a lone surrogate; no nesting deeper than MAX_DEPTH."""
    stack = [(body, 1, None)]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"the request body is nested more than {MAX_DEPTH} levels deep", field)
        try:
            if isinstance(value, str):
                check_text(field or "body", value)
            elif isinstance(value, dict):
                for key, item in value.items():
                    check_text(field or "a key", key)
                    stack.append((item, depth + 1, field or key))
            elif isinstance(value, list):
                stack.extend((item, depth + 1, field) for item in value)
        except InvalidParam as e:
            raise APIError(400, str(e), e.param if field else None) from None


def from_validation_error(e: ValidationError) -> APIError:
    """pydantic's first error -> an OpenAI error whose `param` is the field's path, e.g. messages[0].role."""
    err = e.errors(include_url=False, include_input=False)[0]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    if err["type"] == "extra_forbidden":
        return APIError(400, f"unrecognized request argument: {clip(param, 60)}", param[:60])
    message = err["msg"].removeprefix("Value error, ")
    return APIError(400, f"{param}: {message}" if param else message, param or None)

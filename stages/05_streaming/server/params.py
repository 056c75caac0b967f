"""A checked request's fields as `SamplingParams`: OpenAI's and vLLM's names mapped onto the engine's, the room left
in the context checked (like vLLM, a prompt plus max_tokens beyond it is an error), and the structured-output
constraint taken from ``response_format`` or ``structured_outputs``. Every value error names the field the client
sent.
"""
from __future__ import annotations

from common.sampling import SamplingParams
from common.validate import InvalidParam

from .errors import APIError
from .protocol import SamplingFields

PENALTIES = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
             "allowed_token_ids")  # passed to SamplingParams as they are (logit_bias: its keys become ids)


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

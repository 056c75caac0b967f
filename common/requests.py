"""A request on its way in and out: the arguments of ``generate`` checked, a prompt checked and tokenized, and the
finished sequences of a request made into one `RequestOutput` (vLLM's input and output processing)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from common.config import ModelConfig
from common.sampling import SamplingParams
from common.sequence import CompletionOutput, RequestMetrics, RequestOutput, Sequence
from common.tokenizer import Tokenizer
from common.validate import InvalidParam, check_text, clip

Prompt = str | list[int]


@dataclass(frozen=True)
class Request:
    """A checked prompt, before its sequences exist: what a request's logits processors are made from."""
    prompt: str | None
    prompt_token_ids: list[int]
    eos_token_id: int | tuple[int, ...]  # the model's: one id, or several (any of them ends the request)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset([self.eos_token_id] if isinstance(self.eos_token_id, int) else self.eos_token_id)


def check_arguments(prompts, sampling_params) -> tuple[list, list]:
    """Malformed arguments fail before any work; a bad prompt or a bad entry of a list of sampling_params is one
    bad request, which fails alone (in `tokenize`)."""
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidParam("prompts", f"prompts must be a string, a list of token ids, or a list of those; "
                                      f"got {type(prompts).__name__}")
    if isinstance(sampling_params, (list, tuple)):
        if len(sampling_params) != len(prompts):
            raise InvalidParam("sampling_params",
                               f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
        return list(prompts), list(sampling_params)
    return list(prompts), [SamplingParams.coerce(sampling_params)] * len(prompts)


def tokenize(prompt: Prompt, tokenizer: Tokenizer, config: ModelConfig, max_model_len: int,
             context_note: str = "") -> Request:
    """Check one prompt (text or token ids) against the vocabulary and the context; raise `InvalidParam` saying
    what to fix."""
    if isinstance(prompt, str):
        check_text("prompt", prompt)
        text, ids = prompt, tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        text, ids = None, list(prompt)
        bad = [t for t in ids if not 0 <= t < config.vocab_size]
        if bad:
            raise InvalidParam("prompt", f"prompt token ids {clip(bad[:5])} are outside the vocabulary "
                                         f"[0, {config.vocab_size})")
    else:
        raise InvalidParam("prompt", "a prompt must be a string or a list of integer token ids")
    if not ids:
        raise InvalidParam("prompt", "the prompt is empty: give at least one token")
    if len(ids) >= max_model_len:
        window = context_note if max_model_len == config.max_position_embeddings else ""
        raise InvalidParam("prompt", f"the prompt has {len(ids)} tokens but max_model_len is "
                                     f"{max_model_len}{window}: shorten it to at most {max_model_len - 1} tokens"
                                     + raise_note(max_model_len, len(ids), config))
    return Request(text, ids, config.eos_token_ids or config.eos_token_id)


def raise_note(max_model_len: int, prompt_len: int, config: ModelConfig) -> str:
    """How to make room instead, where the model's context allows it."""
    limit = config.max_position_embeddings
    if max_model_len >= limit or prompt_len >= limit:
        return ""
    return (f", or raise max_model_len (--max-model-len) above {prompt_len}, up to the model's context of "
            f"{limit:,} tokens")


def to_output(seq: Sequence) -> RequestOutput:
    return RequestOutput(seq.seq_id, seq.prompt, seq.prompt_token_ids, list(seq.output_token_ids), seq.output_text,
                         seq.finish_reason, seq.metrics, error=seq.error)


def group_output(group: list[Sequence]) -> RequestOutput:
    """One output per request: the first sample's fields, and every sample in ``outputs``."""
    out = to_output(group[0])
    out.outputs = [CompletionOutput(s.sample_index, list(s.output_token_ids), s.output_text, s.finish_reason,
                                    list(s.logprobs) if s.params.logprobs is not None else None) for s in group]
    if group[0].params.prompt_logprobs is not None:
        out.prompt_logprobs = list(group[0].prompt_logprobs)
    return out


def error_output(prompt, message: str) -> RequestOutput:
    ids = prompt if isinstance(prompt, list) else []
    return RequestOutput(-1, prompt if isinstance(prompt, str) else None, ids, [], "", "error",
                         RequestMetrics(arrival_time=time.perf_counter()), error=message)

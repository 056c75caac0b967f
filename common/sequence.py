"""A request as the engine sees it (vLLM's `Sequence`), and what `generate` returns."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from common.processors import apply_processors
from common.sampler import Logprob, make_generator
from common.sampling import SamplingParams

_ids = itertools.count()


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def time_per_output_token(self) -> float | None:
        """Mean gap between output tokens after the first (decode pace)."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


@dataclass
class CompletionOutput:
    """One of a request's n samples (vLLM's name)."""
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None
    # With SamplingParams.logprobs: per token, (its log-probability, the most likely [(id, log-probability)]).
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None  # "stop", "length", or "error" (then `error` says why)
    metrics: RequestMetrics
    error: str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)  # vLLM's: one per sample (n), the first above
    prompt_logprobs: list | None = None  # with SamplingParams.prompt_logprobs: per prompt token, the first None

    def __post_init__(self):
        if not self.outputs:
            self.outputs = [CompletionOutput(0, self.token_ids, self.text, self.finish_reason)]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)


class Sequence:
    """A request as the engine sees it: its prompt, the tokens sampled so far, and how many are cached. Complete
    when made (common/requests.py); then two drivers change it, each its own fields: the scheduler (``status``,
    ``num_cached_tokens``, ``spec_token_ids``) and ``advance`` after each step (tokens kept, their text, the end)."""

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, eos_token_id: int | tuple[int, ...],
                 device: torch.device, prompt: str | None = None, processors: list | None = None,
                 max_len: int | None = None, detokenizer=None, index: int = 0, group: list | None = None,
                 prediction_ids=None):
        self.seq_id, self.prompt, self.params = next(_ids), prompt, params
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.eos_token_ids = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        self.eos_token_id = eos_token_id if isinstance(eos_token_id, int) else tuple(eos_token_id)[0]  # Llama 3 has two
        self.generator = make_generator(params, device)
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None  # why it ended with finish_reason "error"
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())
        self.max_len = max_len  # the engine's max_model_len: a hard stop
        self.index = index  # position in its generate() call (the label in timelines)
        self.num_cached_tokens = 0  # tokens whose keys and values are in the KV cache
        self.output_text = ""  # detokenized as tokens arrive (with a detokenizer)
        self.detokenizer = detokenizer  # common.tokenizer.IncrementalDetokenizer
        self.group: list[Sequence] = group if group is not None else []  # its request's n samples, shared by them
        self.sample_index = len(self.group)  # its place among them: its seed is the request's + sample_index
        self.group.append(self)
        self.logprobs: list[Logprob] = []  # per output token, with params.logprobs
        self.prompt_logprobs: list = [None]  # with params.prompt_logprobs, per prompt token (the first has none)
        self.processors: list = list(processors or [])  # common/processors.py; their state follows the kept tokens
        self.prediction_ids = prediction_ids  # SamplingParams.prediction's tokens, tokenized off the engine's thread
        self.spec_token_ids: list[int] = []  # draft tokens fed after its own next step (stage 06); `advance` clears
        self.spec_from_prediction = False  # they are its predicted output's (OpenAI's prediction counts count them)
        self.num_drafted_tokens = self.num_accepted_tokens = 0  # its prediction's drafts verified, and of them kept

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next step must feed: the prompt at first, then the last sampled token (and drafts to verify)."""
        return len(self) + len(self.spec_token_ids) - self.num_cached_tokens

    def feed_ids(self, n: int) -> list[int]:
        """The next ``n`` tokens to feed: its own uncached tokens, then its draft tokens."""
        start = self.num_cached_tokens
        own = self.token_ids[start:start + n]
        return own + self.spec_token_ids[:n - len(own)]

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def processed(self, logits: torch.Tensor, ahead: list[int]) -> torch.Tensor:
        """Its logits row after its processors, at the position after its kept tokens and ``ahead`` (drafts a step
        assumes kept): each rule looks ahead along them and comes back, so it follows the kept tokens alone."""
        if not self.processors:
            return logits
        for rule in self.processors:
            for token in ahead:
                rule.accept(token)
        try:
            return apply_processors(self.processors, logits, self.output_token_ids + ahead)
        finally:
            if ahead:
                for rule in self.processors:
                    rule.rollback(len(ahead))

    def append_token(self, token_id: int, logprobs: Logprob | None = None) -> None:
        """Record a kept token, its log-probabilities, its time and its text; its processors move past it."""
        now = time.perf_counter()
        self.output_token_ids.append(token_id)
        if logprobs is not None:
            self.logprobs.append(logprobs)
        for rule in self.processors:
            rule.accept(token_id)
        self.metrics.token_times.append(now)
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        if self.detokenizer is not None:
            self.output_text += self.detokenizer.add(token_id)

    def stop_reason(self) -> str | None:
        """Why the request is done after its last token ("stop", "length" or "error"), or None if it goes on. A stop
        wins over the length limit (a stop token sampled as the ``max_tokens``-th finishes with "stop", as in vLLM)."""
        p, token = self.params, self.output_token_ids[-1]
        failed = next((rule.error for rule in self.processors if rule.error), None)
        if failed:  # a rule cannot go on (no token it allows is left): this request alone ends
            self.error = failed
            return "error"
        if len(self.output_token_ids) < p.min_tokens and not (self.max_len and len(self) >= self.max_len):
            return None  # vLLM: no stop of any kind before min_tokens
        if p.stop and any(s in self.output_text for s in p.stop):  # a stop string may span tokens
            return "stop"
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if any(rule.is_terminated() for rule in self.processors):  # a structure is complete (stage 07)
            return "stop"
        if len(self.output_token_ids) >= p.max_tokens or (self.max_len and len(self) >= self.max_len):
            return "length"
        return None

    def finish(self, reason: str) -> None:
        if self.detokenizer is not None:
            self.output_text += self.detokenizer.flush()  # a character left incomplete at the end
            self.detokenizer = None
        hits = [i for i in (self.output_text.find(s) for s in self.params.stop) if i >= 0]
        if hits:  # the text ends before the earliest match, whichever stop string it is and wherever it is listed
            self.output_text = self.output_text[:min(hits)]
        self.status, self.finish_reason = SequenceStatus.FINISHED, reason
        self.metrics.finished_time = time.perf_counter()

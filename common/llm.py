"""The `LLM` front end every stage shares: load, validate, tokenize, run the engine, collect.

A stage names its engine (``engine_class``); the engine is built from parts and its
``step()`` reads schedule -> run -> postprocess. ``generate`` submits the requests and steps
the engine until it has no work; after every step each observer gets the step's `StepEvent`
(the statistics and the progress bar always; a block audit, a recording or a server's metrics
when attached with ``add_observer``).
"""
from __future__ import annotations

import os
import time
from typing import Sequence as Seq

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.loader import load_model, parse_dtype, resolve_device
from common.paths import DEFAULT_MODEL
from common.sampling import SamplingParams
from common.sequence import CompletionOutput, RequestMetrics, RequestOutput, Sequence
from common.events import Observer, StepEvent, make_event
from common.processors import LogitsProcessor, build_processors
from common.stats import EngineStats
from common.tokenizer import IncrementalDetokenizer, Tokenizer
from common.validate import InvalidParam, check_int, check_text, clip

Prompt = str | list[int]


class LLM:
    engine_class: type  # each stage's engine (common.engine.Engine): built from (model, max_model_len, max_num_seqs,
    # **engine_options)

    def __init__(self, model: str = DEFAULT_MODEL, dtype: str = "bfloat16", device: str | None = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 16, seed: int = 0,
                 batch_invariant: bool = True, quantization: str | None = None,
                 trace: str | os.PathLike | None = None, **engine_options):
        # Wrong types fail here, before the model loads, with the argument's name.
        if max_model_len is not None:
            check_int("max_model_len", max_model_len, 2)
        check_int("max_num_seqs", max_num_seqs, 1)
        check_int("seed", seed, 0, 2**64 - 1)
        if not isinstance(model, (str, os.PathLike)):
            raise InvalidParam("model", f"model={clip(model)} is invalid: give a checkpoint folder or a model name")
        if not isinstance(batch_invariant, bool):
            raise InvalidParam("batch_invariant",
                               f"batch_invariant={clip(batch_invariant)} is invalid: give True or False")
        from common.prepare import resolve_model  # lazily: `python -m common.prepare` imports common first
        self.folder = resolve_model(model)
        self.device = resolve_device(device)
        self.dtype = parse_dtype(dtype)
        # batch_invariant=False runs plain torch math (whole-batch matmuls, fused attention): faster, but a
        # request's tokens then depend on what it is batched with. For measuring what invariance costs.
        self.batch_invariant = batch_invariant
        self.model = load_model(self.folder, self.dtype, self.device, self.engine_class.model_class,
                                batch_invariant=batch_invariant, quantization=quantization)
        self.quantization = self.model.quantization  # None, 'int8', 'int4' or 'w4a8' (common.numerics.quant)
        self.config = self.model.config
        self.tokenizer = Tokenizer(self.folder)
        limit = self.config.max_position_embeddings
        window = self.config.sliding_window
        self.window_note = (f" (the model's sliding window: stepwise's attention is full attention, which is "
                            f"sliding-window attention only within the window's {window} tokens)"
                            if window is not None and window == limit else "")
        if max_model_len is not None:
            try:
                check_int("max_model_len", max_model_len, 2, limit)  # the model's context
            except InvalidParam as e:
                raise InvalidParam("max_model_len", f"{e}{self.window_note}") from None
        # The model allows 8,192 positions; 2,048 keeps a per-slot reservation (stage 02) affordable.
        self.max_model_len = max_model_len or min(limit, 2048)
        self.max_num_seqs = max_num_seqs
        self.engine = self.engine_class(self.model, max_model_len=self.max_model_len, max_num_seqs=max_num_seqs,
                                        **engine_options)
        self.stats = EngineStats()
        self.progress: Progress | None = None
        self.observers: list[Observer] = []  # attached with add_observer; they see every step of every run
        self.trace = None  # trace=PATH: the X-ray's recorder (common/trace.py), which writes PATH after each generate
        if trace is not None:
            from common.trace import Recorder  # lazily: an engine without a trace never imports it
            label = type(self).__module__.removeprefix("stages.").removesuffix(".engine")
            self.trace = self.add_observer(Recorder(label, path=trace))
        self.num_steps = 0  # steps this LLM has run, across runs
        self.started = time.perf_counter()  # the time axis of the step events
        torch.manual_seed(seed)

    def add_observer(self, observer: Observer) -> Observer:
        """Attach ``observer``: after every step its ``on_step(event)`` is called (in the stepping thread)."""
        self.observers.append(observer)
        return observer

    def remove_observer(self, observer: Observer) -> None:
        self.observers.remove(observer)

    # ---- requests -------------------------------------------------------------------
    def make_sequence(self, prompt: Prompt, params: SamplingParams | dict | None) -> Sequence:
        """Validate one request; raise ValueError with a message that says what to fix."""
        params = SamplingParams.coerce(params)
        params.validate(self.config.vocab_size)
        if isinstance(prompt, str):
            check_text("prompt", prompt)
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            text, ids = None, list(prompt)
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise InvalidParam("prompt", f"prompt token ids {clip(bad[:5])} are outside the vocabulary "
                                             f"[0, {self.config.vocab_size})")
        else:
            raise InvalidParam("prompt", "a prompt must be a string or a list of integer token ids")
        if not ids:
            raise InvalidParam("prompt", "the prompt is empty: give at least one token")
        if len(ids) >= self.max_model_len:
            window = self.window_note if self.max_model_len == self.config.max_position_embeddings else ""
            raise InvalidParam("prompt", f"the prompt has {len(ids)} tokens but max_model_len is "
                                         f"{self.max_model_len}{window}: shorten it to at most "
                                         f"{self.max_model_len - 1} tokens")
        eos = self.config.eos_token_ids or self.config.eos_token_id
        seq = Sequence(ids, params, eos, self.device, prompt=text)
        seq.processors = self.make_processors(params, seq)
        seq.max_len = self.max_model_len
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer)
        self.engine.check(seq)  # what this engine cannot run (a prompt larger than its KV pool, say)
        return seq

    def make_processors(self, params: SamplingParams, seq: Sequence) -> list[LogitsProcessor]:
        """A request's logits processors, in order: the built-in rules of its parameters, then its structured-output
        constraint, if any (stage 07). Each sample of n > 1 gets its own, so their states stay apart."""
        words = [self.bad_word_ids(w) for w in params.bad_words or []]
        return build_processors(params, seq.prompt_token_ids, seq.eos_token_ids,
                                [ids for w in words for ids in w]) + self.constraint_processors(params, seq)

    def constraint_processors(self, params: SamplingParams, seq: Sequence) -> list[LogitsProcessor]:
        """The request's structured-output constraint. Only stage 07 applies one (it overrides this): elsewhere such
        a request is refused, never run unconstrained."""
        if params.structured_outputs is not None:
            raise InvalidParam("structured_outputs", f"{type(self).__module__}.{type(self).__name__} does "
                                                     "not apply structured_outputs: use stage 07 (stages.structured)")
        return []

    def bad_word_ids(self, word: str) -> list[list[int]]:
        """vLLM's bad_words rule: the word's tokens as it would begin the text, and as a later word (after a space)
        where that gives another first token and as many tokens."""
        alone = self.tokenizer.encode(word.lstrip())
        spaced = self.tokenizer.encode(" " + word.lstrip())
        return [alone] + ([spaced] if spaced[0] != alone[0] and len(spaced) == len(alone) else [])

    def generate(self, prompts: Prompt | Seq[Prompt], sampling_params=None,
                 progress: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion. An invalid request fails alone (finish_reason 'error')."""
        prompts, params = self._check_arguments(prompts, sampling_params)
        slots: list[list[Sequence] | RequestOutput] = []
        for prompt, p in zip(prompts, params):
            try:
                slots.append(self.make_samples(prompt, p))
            except ValueError as e:
                slots.append(error_output(prompt, str(e)))
        seqs = [s for group in slots if isinstance(group, list) for s in group]
        for i, seq in enumerate(seqs):
            seq.index = i  # arrival order, the label in timelines
        self.stats = EngineStats()
        start = time.perf_counter()
        with self._progress(progress, sum(s.params.max_tokens for s in seqs)):
            if seqs:
                self._run(seqs)
        self.progress = None
        self.stats.wall_seconds = time.perf_counter() - start
        if self.trace is not None:
            self.trace.end_run()
        self.stats.output_tokens = sum(len(s.output_token_ids) for s in seqs)
        return [self.group_output(s) if isinstance(s, list) else s for s in slots]

    def make_samples(self, prompt: Prompt, params: SamplingParams | dict | None) -> list[Sequence]:
        """A request's n samples (SamplingParams.n), each a sequence of its own with sample i's seed (vLLM's rule:
        `SamplingParams.for_sample`). They know each other (``seq.group``): stage 03 lets them share the prompt's
        KV blocks; stages 01-02 run them apart, since a slot's cache is its own."""
        params = SamplingParams.coerce(params)
        params.validate(self.config.vocab_size)
        group = [self.make_sequence(prompt, params.for_sample(i)) for i in range(params.n)]
        for i, seq in enumerate(group):
            seq.group, seq.sample_index = group, i
        return group

    def group_output(self, group: list[Sequence]) -> RequestOutput:
        """One output per request: the first sample's fields, and every sample in ``outputs``."""
        out = self.to_output(group[0])
        out.outputs = [CompletionOutput(s.sample_index, list(s.output_token_ids), s.output_text, s.finish_reason,
                                        list(s.logprobs) if s.params.logprobs is not None else None) for s in group]
        if group[0].params.prompt_logprobs is not None:
            out.prompt_logprobs = list(group[0].prompt_logprobs)
        return out

    @staticmethod
    def _check_arguments(prompts, sampling_params) -> tuple[list, list]:
        """Malformed arguments fail before any work; a bad prompt or a bad entry of a list of sampling_params
        is one bad request, which fails alone (in `make_sequence`)."""
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

    def to_output(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(seq.seq_id, seq.prompt, seq.prompt_token_ids, list(seq.output_token_ids),
                             seq.output_text, seq.finish_reason, seq.metrics, error=seq.error)

    # ---- engine -------------------------------------------------------------------------
    @property
    def timeline(self) -> list[list[int | None]]:
        """Per step of the last `generate`: which request ran in each slot (None: idle)."""
        return self.stats.timeline

    def _run(self, seqs: list[Sequence]) -> None:
        """Submit every request, then step the engine until it has no work (stage 05 steps it through its loop)."""
        for seq in seqs:
            self.engine.add(seq)
        try:
            while self.engine.has_work():
                self.step()
        finally:  # an exception must not leave requests holding KV memory into the next call
            self.engine.release()

    def step(self) -> StepEvent:
        """One engine step; then every observer sees what it did."""
        start = time.perf_counter()
        result = self.engine.step()
        end = time.perf_counter()
        event = make_event(result, self.num_steps, start - self.started, end - start, self.engine.state())
        self.num_steps += 1
        self.stats.on_step(event)
        if self.progress is not None:
            self.progress.advance(self._task, event.kept_tokens)
        for observer in self.observers:
            observer.on_step(event)
        return event

    def _progress(self, enabled: bool, total: int):
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("tokens"), TimeElapsedColumn(), disable=not enabled, transient=True)
        self._task = self.progress.add_task(type(self).__module__.split(".")[-1], total=total)
        return self.progress


def error_output(prompt, message: str) -> RequestOutput:
    ids = prompt if isinstance(prompt, list) else []
    return RequestOutput(-1, prompt if isinstance(prompt, str) else None, ids, [], "", "error",
                         RequestMetrics(arrival_time=time.perf_counter()), error=message)

"""The `LLM` front end every stage shares: check the options, build the stage's engine, make requests, step.

A stage names its assembly (``build``: stages/NN/engine.py's, from an `EngineConfig` to an engine whose
``step()`` reads schedule -> run -> postprocess). ``generate`` submits the requests and steps the engine until it
has no work; after every step each observer gets the step's `StepEvent` (the statistics and the progress bar
always; a block audit, a recording or a server's metrics when attached with ``add_observer``).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Sequence as Seq

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.engine import Engine
from common.engine_config import EngineConfig, context_note
from common.events import Observer, StepEvent, make_event
from common.paths import DEFAULT_MODEL
from common.processors import LogitsProcessor, build_processors
from common.requests import Prompt, Request, check_arguments, error_output, group_output, tokenize
from common.sampling import SamplingParams
from common.sequence import RequestOutput, Sequence
from common.stats import EngineStats
from common.tokenizer import IncrementalDetokenizer, Tokenizer
from common.validate import InvalidParam


class LLM:
    build: Callable[[EngineConfig, Tokenizer], Engine]  # each stage's assembly (its engine.py's ``build``)
    # Options the shared command line and the ladder (stages/cli.py) give this stage when they are not given.
    command_line_defaults: Mapping[str, object] = MappingProxyType({})

    def __init__(self, model: str | os.PathLike = DEFAULT_MODEL, *, trace: str | os.PathLike | None = None,
                 build: Callable[[EngineConfig, Tokenizer], Engine] | None = None,
                 constraints: Callable[[SamplingParams, Request], list[LogitsProcessor]] | None = None, **options):
        """``options``: `EngineConfig.create`'s (vLLM's names); ``trace``: write the X-ray's recording there.
        A later stage that holds this front end instead of subclassing it (stages 06-07 hold stage 05's) gives its
        assembly as ``build`` and, stage 07, its grammar as ``constraints`` (a request's constraint processors)."""
        self.engine_config = EngineConfig.create(model, **options)  # every option checked, before the weights load
        m = self.engine_config.model
        self.folder, self.device, self.dtype, self.batch_invariant = Path(m.folder), m.device, m.dtype, \
            m.batch_invariant
        self.max_model_len = m.max_model_len
        self.tokenizer = Tokenizer(self.folder)
        build = build or type(self).build
        self.stage = build.__module__  # the assembly's module: the stage's, also where a later stage holds this one
        self.constraints = constraints
        self.engine = build(self.engine_config, self.tokenizer)
        self.model = self.engine.model
        self.quantization = self.model.quantization  # None, 'int8', 'int4' or 'w4a8' (common.numerics.quant)
        self.config = self.model.config  # the model's shape
        self.window_note = context_note(self.config)
        self.stats = EngineStats()
        self.progress: Progress | None = None
        self.observers: list[Observer] = []  # attached with add_observer; they see every step of every run
        self.trace = None  # trace=PATH: the X-ray's recorder (common/trace.py), which writes PATH after each generate
        if trace is not None:
            from common.trace import Recorder  # lazily: an engine without a trace never imports it
            folder = Path(sys.modules[self.stage].__file__).parent.name if self.stage.startswith("stages.") else None
            label = folder or self.stage.removesuffix(".engine")  # a stage's by its folder's name (03_paged_kv)
            self.trace = self.add_observer(Recorder(label, path=trace))
        self.num_steps = 0  # steps this LLM has run, across runs
        self.started = time.perf_counter()  # the time axis of the step events
        torch.manual_seed(m.seed)

    @property
    def max_num_seqs(self) -> int:
        """The most requests in flight (stages 01-02: the batch slots the KV budget allows)."""
        return self.engine.max_num_seqs

    def add_observer(self, observer: Observer) -> Observer:
        """Attach ``observer``: after every step its ``on_step(event)`` is called (in the stepping thread)."""
        self.observers.append(observer)
        return observer

    def remove_observer(self, observer: Observer) -> None:
        self.observers.remove(observer)

    # ---- requests -------------------------------------------------------------------
    def make_samples(self, prompt: Prompt, params: SamplingParams | dict | None,
                     first_index: int = 0) -> list[Sequence]:
        """A request's n samples (SamplingParams.n), each a sequence of its own with sample i's seed (vLLM's rule:
        `SamplingParams.for_sample`), numbered from ``first_index``. They know each other (``seq.group``): stage 03
        lets them share the prompt's KV blocks; stages 01-02 run them apart, since a slot's cache is its own. An
        invalid request raises ValueError saying what to fix."""
        params = SamplingParams.coerce(params)
        params.validate(self.config.vocab_size)  # once: a sample's parameters differ from it in n and seed alone
        request = tokenize(prompt, self.tokenizer, self.config, self.max_model_len, self.window_note)
        # A predicted output (stage 06 drafts from it) is tokenized here, where the request is prepared: a server
        # prepares requests on worker threads, so a 1 MB prediction never stalls the engine's steps.
        predicted = None if params.prediction is None else np.asarray(self.tokenizer.encode(params.prediction))
        group: list[Sequence] = []
        for i in range(params.n):
            p = params.for_sample(i)
            seq = Sequence(request.prompt_token_ids, p, request.eos_token_id, self.device, prompt=request.prompt,
                           processors=self.make_processors(p, request), max_len=self.max_model_len,
                           detokenizer=IncrementalDetokenizer(self.tokenizer), index=first_index + i, group=group,
                           prediction_ids=predicted)
            self.engine.check(seq)  # what this engine cannot run (a prompt larger than its KV pool, say)
        return group

    def make_processors(self, params: SamplingParams, request: Request) -> list[LogitsProcessor]:
        """A request's logits processors, in order: the built-in rules of its parameters, then its structured-output
        constraint, if any (stage 07). Each sample of n > 1 gets its own, so their states stay apart."""
        words = [self.bad_word_ids(w) for w in params.bad_words or []]
        return build_processors(params, request.prompt_token_ids, request.eos_token_ids,
                                [ids for w in words for ids in w]) + self.constraint_processors(params, request)

    def constraint_processors(self, params: SamplingParams, request: Request) -> list[LogitsProcessor]:
        """The request's structured-output constraint. Only stage 07 applies one (it gives ``constraints``, or a
        front end mixes in its ``StructuredOutputs``): elsewhere such a request is refused, never run unconstrained."""
        if self.constraints is not None:
            return self.constraints(params, request)
        if params.structured_outputs is not None:
            raise InvalidParam("structured_outputs", f"{self.stage}'s LLM does not apply structured_outputs: use "
                                                     "stage 07 (stages.structured)")
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
        prompts, params = check_arguments(prompts, sampling_params)
        slots: list[list[Sequence] | RequestOutput] = []
        seqs: list[Sequence] = []  # in arrival order: a sequence's index, the label in timelines
        for prompt, p in zip(prompts, params):
            try:
                slots.append(self.make_samples(prompt, p, first_index=len(seqs)))
                seqs += slots[-1]
            except ValueError as e:
                slots.append(error_output(prompt, str(e)))
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
        return [group_output(s) if isinstance(s, list) else s for s in slots]

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


"""Every stage's engine: its parts, one step that reads schedule -> run -> postprocess, and what a step did.

A stage's ``engine.py`` builds an `LLMEngine` from parts (a scheduler, a KV cache, a `ModelRunner` over a model); the
step loop is written once, here. The `LLM` front end (common/llm.py) talks to it through the `Engine` protocol alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from common.sampler import Logprob
from common.sequence import Sequence


@dataclass
class SeqOutput:
    """What the runner computed for one sequence in one step. It changes no sequence: ``advance`` applies it."""
    tokens: list[int] = field(default_factory=list)  # sampled, in position order (empty: a prompt chunk)
    logprobs: list[Logprob] | None = None  # one per token, with SamplingParams.logprobs
    prompt_logprobs: list[Logprob] = field(default_factory=list)  # prompt positions this step scored, in order
    drafted: int = 0  # draft tokens the step fed after the sequence's own (speculative decoding)
    kept: int = 0  # tokens `advance` kept (a stop cuts the run)
    accepted: int = 0  # of the drafts, those kept


@dataclass
class ScheduledBatch:
    """What the scheduler chose for one step (vLLM's SchedulerOutput): the sequences, what each feeds, where their KV
    goes, and what the choice did to the queue."""
    seqs: list[Sequence]  # in the step's order
    lens: list[int]  # tokens each feeds (draft tokens included)
    starts: list[int]  # position of the first token each feeds
    slots: list[int] = field(default_factory=list)  # stages 01-02: each sequence's row of the contiguous cache
    new_batch: bool = False  # stage 01: a new static batch, which gets a buffer of its own
    tables: list[list[int]] = field(default_factory=list)  # stage 03 on: each sequence's block table
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (source, destination) blocks
    admitted: list[int] = field(default_factory=list)  # seq_ids that started (or restarted) running this step
    preempted: list[int] = field(default_factory=list)  # seq_ids evicted to make room (stage 03 on)
    prefix_hits: dict[int, int] = field(default_factory=dict)  # seq_id -> prompt tokens found in the prefix cache
    prefix_query_tokens: int = 0  # prompt tokens looked up in it this step
    propose_seconds: float = 0.0  # time spent guessing draft tokens before the step (stage 06 on)


@dataclass
class StepResult:
    """What one engine step did: the front end turns it into a `StepEvent` for the observers."""
    batch: ScheduledBatch
    outputs: list[SeqOutput]  # what the runner sampled for each of the batch's sequences


@dataclass
class BlockState:
    """The paged KV pool after a step (stage 03 on)."""
    num_blocks: int
    block_size: int
    num_free: int  # blocks nobody holds (cached ones among them)
    tables: dict[int, list[int]]  # seq_id -> its block table, for every sequence holding blocks
    cached: list[int]  # free blocks that still hold a prefix another request can revive

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free


@dataclass
class EngineState:
    """The engine's gauges right after a step: what the observers read besides the step itself."""
    num_slots: int  # batch slots (stages 01-02) or the most sequences in flight
    num_in_step: int  # sequences in flight during the step (the ones it finished included)
    num_running: int  # sequences in flight after it
    num_waiting: int
    kv_bytes_reserved: int  # KV memory set aside
    kv_bytes_used: int  # KV memory holding tokens
    blocks: BlockState | None = None


class Engine(Protocol):
    """What the front end needs of an engine (`LLMEngine`, or the reference's)."""
    model: object  # the Llama it runs

    def check(self, seq: Sequence) -> None:
        """Raise `InvalidParam` for a request this engine can never run."""

    def add(self, seq: Sequence) -> None: ...
    def has_work(self) -> bool: ...
    def step(self) -> StepResult: ...
    def state(self) -> EngineState: ...

    def release(self) -> None:
        """Drop every request and what it holds (after an error, or at the end of a run)."""


class LLMEngine:
    """The engine every stage runs, assembled from the parts its ``build`` chose."""

    def __init__(self, model, scheduler, cache, runner):
        self.model, self.scheduler, self.cache, self.runner = model, scheduler, cache, runner

    def step(self) -> StepResult:
        batch = self.scheduler.schedule()  # which sequences run, how many tokens each feeds, where their KV goes
        if not batch.seqs:
            raise RuntimeError("the scheduler could not run anything: a request larger than the pool?")
        self.cache.prepare_step(batch)  # where each new token's KV goes and what each attends to
        outputs = self.runner.run(batch.seqs, batch.lens, self.cache)  # one forward pass, then sampling
        self.scheduler.postprocess(batch, outputs)  # keep the sampled tokens, free what finished
        return StepResult(batch, outputs)

    def check(self, seq: Sequence) -> None:
        self.scheduler.check(seq)

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is (its client went away); what it holds goes back."""
        self.scheduler.abort(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def release(self) -> None:
        self.scheduler.release()

    def state(self) -> EngineState:
        return self.scheduler.state(self.cache)

    @property
    def max_num_seqs(self) -> int:
        """The most requests in flight (stages 01-02: the batch slots)."""
        return self.scheduler.max_num_seqs


def advance(seq: Sequence, fed: int, out: SeqOutput) -> int:
    """After a step: apply one sequence's output token by token, as one-at-a-time decoding would (each stop rule
    checked at once, so a stop ends the request at its exact token and the rest of the run is dropped). The KV cache
    then holds the tokens fed, less the drafts not kept (their slots are the caller's to give back). Returns how
    many tokens were kept (also recorded in ``out``)."""
    seq.prompt_logprobs.extend(out.prompt_logprobs)
    kept = 0
    for i, token in enumerate(out.tokens):
        seq.append_token(token, out.logprobs[i] if out.logprobs is not None else None)
        kept += 1
        reason = seq.stop_reason()
        if reason is not None:
            seq.finish(reason)
            break
    # The drafts kept are those the kept run repeats; the token after them (a correction or a bonus) is not cached.
    drafts = seq.spec_token_ids[:out.drafted]
    agreed = next((i for i, (d, t) in enumerate(zip(drafts, out.tokens)) if d != t), min(len(drafts), kept))
    out.kept, out.accepted = kept, min(kept, agreed)
    if seq.spec_from_prediction:  # OpenAI's prediction counts: the method's drafts are none of the prediction's
        seq.num_drafted_tokens += out.drafted
        seq.num_accepted_tokens += out.accepted
    seq.num_cached_tokens += fed - out.drafted + out.accepted
    seq.spec_token_ids = []
    return kept

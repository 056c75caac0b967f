"""The step event: what one engine step did, as every observer sees it.

After each step the front end builds one `StepEvent` from the engine's `StepResult` and state for each observer (the
statistics, a progress bar, a server's metrics, a block audit): any ``on_step(event)``, none reaching into the engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from common.engine import EngineState, StepResult
from common.sequence import Sequence


@dataclass
class SeqStep:
    """One sequence in one step."""
    seq_id: int
    index: int  # the request's label: its place in its `generate` call (or arrival order in a server)
    kind: str  # "prefill" (prompt tokens, or a preempted request's recompute), "decode" (one token), "verify"
    start: int  # position of the first token fed
    fed: int  # tokens fed (draft tokens included)
    prompt_fed: int  # of them, prompt tokens
    tokens: list[int]  # tokens kept this step, in order
    drafted: int = 0  # draft tokens fed after its own (speculative decoding)
    accepted: int = 0  # of them, kept
    slot: int | None = None  # the batch slot it ran in (stages 01-02)
    finish_reason: str | None = None  # set in the step it finished
    seq: Sequence | None = field(default=None, repr=False, compare=False)  # the request itself, for live observers


@dataclass
class StepEvent:
    index: int  # steps before this one in the run
    time: float  # seconds from the start of the run to the start of the step
    duration: float  # seconds the step took (schedule, run, postprocess)
    seqs: list[SeqStep]
    admitted: list[int]  # seq_ids that started (or restarted) running
    preempted: list[int]  # seq_ids evicted to the queue to be recomputed
    finished: list[int]  # seq_ids that finished
    prefix_hits: dict[int, int]  # seq_id -> prompt tokens found in the prefix cache
    prefix_query_tokens: int  # prompt tokens looked up in it
    copies: list[tuple[int, int]]  # copy-on-write (source, destination) blocks
    state: EngineState  # the engine's gauges right after the step
    propose_seconds: float = 0.0  # of ``duration``, the time spent guessing draft tokens (stage 06 on)

    @property
    def kept_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.seqs)

    @property
    def prefix_hit_tokens(self) -> int:
        return sum(self.prefix_hits.values())


class Observer(Protocol):
    def on_step(self, event: StepEvent) -> None: ...


def make_event(result: StepResult, index: int, time: float, duration: float, state: EngineState) -> StepEvent:
    """The event of one step: the engine's result, read after postprocess, with its state."""
    b, seqs = result.batch, []
    for i, (seq, fed, start, out) in enumerate(zip(b.seqs, b.lens, b.starts, result.outputs)):
        tokens = out.tokens[:out.kept]
        prompt_fed = max(0, min(fed, seq.num_prompt_tokens - start))
        kind = "verify" if out.drafted else "decode" if fed == 1 and not prompt_fed else "prefill"
        seqs.append(SeqStep(seq.seq_id, seq.index, kind, start, fed, prompt_fed, tokens, out.drafted, out.accepted,
                            b.slots[i] if b.slots else None,
                            seq.finish_reason if seq.is_finished and out.kept else None, seq))
    finished = [s.seq_id for s in seqs if s.finish_reason is not None]
    return StepEvent(index, time, duration, seqs, list(b.admitted), list(b.preempted), finished, dict(b.prefix_hits),
                     b.prefix_query_tokens, list(b.copies), state, b.propose_seconds)

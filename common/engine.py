"""What every stage's engine shares: the result of one step, and the bookkeeping after it.

An engine is built from parts (a scheduler, a KV cache, a `ModelRunner`) and its `step()`
reads schedule -> run -> postprocess. The `LLM` front end (common/llm.py) only needs
``add``, ``has_work``, ``step`` and a few gauges, so every stage plugs into the same
``generate``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common.sequence import Sequence


@dataclass
class StepResult:
    """What one engine step did, for whoever observes the engine (statistics, timelines, streams)."""
    seqs: list[Sequence]  # the sequences that ran, in the step's order
    lens: list[int]  # tokens each fed
    starts: list[int]  # position of the first token each fed
    tokens: list[int | None]  # the token each sampled (None: a prompt chunk that completes nothing)
    slots: list[int | None] = field(default_factory=list)  # the batch slot each ran in (stages 01-02)
    preempted: int = 0  # requests preempted to make room (stage 03 on)
    prefix_hit_tokens: int = 0  # prompt tokens found in the prefix cache (stage 03 on)
    prefix_query_tokens: int = 0  # prompt tokens looked up in it


def advance(seq: Sequence, fed: int, token: int | None) -> bool:
    """After a step: ``fed`` more of ``seq``'s tokens are in the KV cache and ``token`` (if any) was sampled for
    it. Records the token and finishes the request when it is done; returns whether it finished. Every
    scheduler's ``postprocess`` calls this, then frees what a finished request held."""
    seq.num_cached_tokens += fed
    if token is not None:
        seq.append_token(token)
        reason = seq.stop_reason()
        if reason is not None:
            seq.finish(reason)
    return seq.is_finished

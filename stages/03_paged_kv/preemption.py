"""Preemption: when a running request needs a block and none is free, someone gives theirs back.

vLLM's recompute preemption: the most recently admitted request is the victim. Its blocks go back to the pool
(cached ones stay revivable) and it returns to the front of the queue; admitted again, its prompt and the tokens it
had generated are recomputed (often largely found in the prefix cache). Nothing is lost but time: every step's math
is batch-invariant, so the recomputed request goes on with exactly the same tokens.
"""
from __future__ import annotations

from collections import deque

from common.sequence import Sequence, SequenceStatus

from .block_manager import BlockManager


def make_room(seq: Sequence, num_tokens: int, running: list[Sequence], waiting: deque[Sequence],
              block_manager: BlockManager) -> tuple[bool, list[Sequence]]:
    """Preempt the newest running requests until ``seq`` can append ``num_tokens`` tokens; returns (whether ``seq``
    can run, the requests preempted, in order). With nothing newer left, ``seq`` steps aside itself, a preemption too
    (its blocks go back, it is recomputed later; the step's event and ``stats.preemptions`` include it)."""
    victims = []
    while not block_manager.can_append(seq, num_tokens) and running[-1] is not seq:
        victims.append(running.pop())
        preempt(victims[-1], waiting, block_manager)
    if block_manager.can_append(seq, num_tokens):
        return True, victims
    victims.append(running.pop())  # ``seq`` itself, the newest left
    preempt(victims[-1], waiting, block_manager)
    return False, victims


def preempt(seq: Sequence, waiting: deque[Sequence], block_manager: BlockManager) -> None:
    # lab 03.5 begin: preempt a request
    block_manager.free_sequence(seq)
    seq.status = SequenceStatus.WAITING
    waiting.appendleft(seq)
    # lab 03.5 end
    seq.spec_token_ids = []  # it recomputes before it drafts again

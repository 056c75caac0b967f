"""Scheduling under a block budget: admit while blocks allow, preempt when they run out.

Every step has a token budget (``max_num_batched_tokens``). Running sequences go
first, oldest first: a decode feeds one token, a prompt still being prefilled feeds
its next chunk (chunked prefill), so a long prompt never stalls the decodes around
it. Whatever budget is left admits waiting sequences, which first take any cached
prefix blocks. When a running sequence needs a block and none is free, the most
recently admitted sequence is preempted: its blocks are freed and it goes back to
the front of the queue, to be recomputed later (vLLM's recompute preemption).
"""
from __future__ import annotations

import time
from collections import deque

from common.sequence import Sequence, SequenceStatus

from .block_manager import BlockManager


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_prefix_caching: bool = True):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], list[int]]:
        """Pick this step's sequences and how many tokens each feeds; their blocks are allocated."""
        bm, budget = self.block_manager, self.max_num_batched_tokens
        seqs, lens, preempted = [], [], False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_new_tokens, budget)
            while not bm.can_append(seq, n) and self.running[-1] is not seq:
                self.preempt(self.running.pop())
                preempted = True
            if not bm.can_append(seq, n):  # nothing newer left to preempt: step aside itself
                self.preempt(self.running.pop())
                preempted = True
                break
            bm.append_slots(seq, n)
            seqs.append(seq), lens.append(n)
            budget -= n
            i += 1
        # Admit newcomers only when nothing had to be preempted: memory is tight otherwise.
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            prefix = bm.cached_prefix(seq) if self.enable_prefix_caching else []
            n = min(len(seq) - len(prefix) * bm.block_size, budget)
            if not bm.can_allocate(seq, n, prefix):
                break
            self.waiting.popleft()
            bm.allocate(seq, prefix)
            bm.append_slots(seq, n)
            seq.status = SequenceStatus.RUNNING
            seq.metrics.first_scheduled_time = seq.metrics.first_scheduled_time or time.perf_counter()
            self.running.append(seq)
            seqs.append(seq), lens.append(n)
            budget -= n
        return seqs, lens

    def preempt(self, seq: Sequence) -> None:
        self.block_manager.free_sequence(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is; its blocks go back to the pool."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self.block_manager.free_sequence(seq)
        if not seq.is_finished:
            seq.finish("abort")

    def release_all(self) -> None:
        for seq in list(self.running):
            self.block_manager.free_sequence(seq)
        self.running.clear()

    def postprocess(self, seqs: list[Sequence]) -> None:
        """After a step: share what was filled, release what finished."""
        for seq in seqs:
            if self.enable_prefix_caching:
                self.block_manager.commit(seq)
            if seq.is_finished:
                self.block_manager.free_sequence(seq)
                self.running.remove(seq)

"""Stage 02: continuous batching (iteration-level scheduling, Orca).

Before every step, finished requests leave their slot and waiting requests
take free slots; a newcomer is prefilled in the same step as the running
requests' decodes. The KV cache reserves ``max_model_len`` positions per slot,
used or not: the waste stage 03 removes.
"""
from __future__ import annotations

import importlib
import time
from collections import deque

from common.kv_cache import ContiguousKVCache
from common.runner import ModelRunner
from common.sequence import Sequence, SequenceStatus

static = importlib.import_module("stages.01_static_batch")


class Scheduler:
    """Slots are refilled at every step, not when the whole batch is done."""

    def __init__(self, num_slots: int):
        self.waiting: deque[Sequence] = deque()
        self.slots: list[Sequence | None] = [None] * num_slots

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots)

    def schedule(self) -> tuple[list[int], list[int]]:
        """Free finished slots, fill free ones; return (slots to run, tokens to feed each)."""
        now = time.perf_counter()
        for i, seq in enumerate(self.slots):
            if seq is not None and seq.is_finished:
                self.slots[i] = None
            if self.slots[i] is None and self.waiting:
                seq = self.slots[i] = self.waiting.popleft()
                seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, now
        run = [i for i, s in enumerate(self.slots) if s is not None]
        # A newcomer feeds its whole prompt (prefill); the others their last token (decode).
        return run, [self.slots[i].num_new_tokens for i in run]


class LLM(static.LLM):
    def _run(self, seqs: list[Sequence]) -> None:
        scheduler = Scheduler(self.max_num_seqs)
        for seq in seqs:
            scheduler.add(seq)
        cache = ContiguousKVCache(self.config, self.max_num_seqs, self.max_model_len, self.dtype, self.device,
                                  self.batch_invariant)
        self.stats.kv_bytes_reserved = cache.reserved_bytes
        runner = ModelRunner(self.model)
        while scheduler.has_work():
            run, lens = scheduler.schedule()
            if not run:
                break
            running = [scheduler.slots[i] for i in run]
            cache.prepare(run, lens, [len(s) for s in running])
            tokens = runner.run(running, lens, cache)
            for seq, token in zip(running, tokens):
                seq.append_token(token)
            self.record_step(scheduler.slots, running, lens, cache)

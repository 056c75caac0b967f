"""Stage 01: static batching.

Take up to ``max_num_seqs`` waiting requests in arrival order, prefill them
together, then decode one token per request per step until the *longest* one
ends. Requests that finish early keep their slot and sit idle: that waste is
the lesson, and `EngineStats` counts it (slot utilization).
"""
from __future__ import annotations

import time
from collections import deque

from common.kv_cache import ContiguousKVCache
from common.llm import BaseLLM
from common.runner import ModelRunner
from common.sequence import Sequence, SequenceStatus


class Scheduler:
    """Hands out whole batches: the next batch starts only when the last one is done."""

    def __init__(self, max_num_seqs: int):
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def next_batch(self) -> list[Sequence]:
        n = min(self.max_num_seqs, len(self.waiting))
        return [self.waiting.popleft() for _ in range(n)]


class LLM(BaseLLM):
    def _run(self, seqs: list[Sequence]) -> None:
        scheduler = Scheduler(self.max_num_seqs)
        for seq in seqs:
            scheduler.add(seq)
        runner = ModelRunner(self.model)
        while batch := scheduler.next_batch():
            self.run_batch(batch, runner)

    def run_batch(self, batch: list[Sequence], runner: ModelRunner) -> None:
        # One contiguous buffer, padded to the longest request the batch can grow to.
        max_len = max(min(len(s) + s.params.max_tokens, self.max_model_len) for s in batch)
        cache = ContiguousKVCache(self.config, len(batch), max_len, self.dtype, self.device, self.batch_invariant)
        self.stats.kv_bytes_reserved = max(self.stats.kv_bytes_reserved, cache.reserved_bytes)
        now = time.perf_counter()
        for seq in batch:
            seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, now
        while True:
            # schedule: every unfinished request of the batch, in its own slot
            slots = [i for i, s in enumerate(batch) if not s.is_finished]
            if not slots:
                return
            running = [batch[i] for i in slots]
            lens = [s.num_new_tokens for s in running]  # the first step prefills every prompt
            # run
            cache.prepare(slots, lens, [len(s) for s in running])
            tokens = runner.run(running, lens, cache)
            # postprocess
            for seq, token in zip(running, tokens):
                seq.append_token(token)
            self.record_step(batch, running, lens, cache)

    def record_step(self, slot_seqs: list[Sequence | None], ran: list[Sequence], lens: list[int],
                    cache: ContiguousKVCache) -> None:
        """Count one step: ``slot_seqs`` is every slot's request (None when empty), ``ran`` those that ran."""
        st = self.stats
        st.steps += 1
        st.slot_steps_available += len(slot_seqs)
        st.slot_steps_used += len(ran)
        st.peak_running = max(st.peak_running, len(ran))
        for seq, n in zip(ran, lens):
            start = len(seq) - 1 - n  # first position fed this step (a token was appended since)
            prefill = max(0, min(n, seq.num_prompt_tokens - start))
            st.prefill_tokens += prefill
            st.decode_tokens += n - prefill
        per_token = self.config.kv_bytes_per_token(cache.k.element_size())
        held = sum(s.num_cached_tokens for s in slot_seqs if s is not None and not s.is_finished)
        held += sum(s.num_cached_tokens for s in ran if s.is_finished)  # freed only after this step
        st.kv_bytes_used = max(st.kv_bytes_used, held * per_token)
        ran_ids = {s.seq_id for s in ran}
        self.timeline.append([s.index if s is not None and s.seq_id in ran_ids else None for s in slot_seqs])
        self._advance(len(ran))

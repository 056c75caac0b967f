"""Scheduling under a block budget: admit while blocks allow, preempt when they run out.

Every step has a token budget (``max_num_batched_tokens``). Running sequences go first,
oldest first: a decode feeds one token, a prompt still being prefilled feeds its next chunk
(**chunked prefill**), so a long prompt never stalls the decodes around it. Whatever budget
is left admits waiting sequences, which first take any cached prefix blocks. Each idea can be
turned off, for the lesson: without chunked prefill a prompt waits until its whole rest fits
one step's budget; without preemption a request is admitted only with blocks reserved for
the longest it can grow, so it never runs out.
"""
from __future__ import annotations

import time
from collections import deque

from common.engine import advance
from common.sequence import Sequence, SequenceStatus

from .block_manager import BlockManager
from .preemption import make_room
from .prefix_cache import PrefixCache


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 prefix_cache: PrefixCache | None = None, chunked_prefill: bool = True, preemption: bool = True,
                 max_model_len: int | None = None):
        self.block_manager, self.prefix_cache = block_manager, prefix_cache
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.chunked_prefill, self.preemption, self.max_model_len = chunked_prefill, preemption, max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.num_preempted = 0  # in the last step
        self.held_tokens = 0  # KV positions holding tokens at the end of the last step

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], list[int]]:
        """Pick this step's sequences and how many tokens each feeds; their blocks are allocated."""
        bm, budget = self.block_manager, self.max_num_batched_tokens
        seqs, lens, self.num_preempted = [], [], 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_new_tokens, budget)
            if n < seq.num_new_tokens and not self.chunked_prefill:
                break  # the rest of this prompt waits for a step with room for all of it
            fits, preempted = make_room(seq, n, self.running, self.waiting, bm)
            self.num_preempted += preempted
            if not fits:
                break
            bm.append_slots(seq, n)
            seqs.append(seq), lens.append(n)
            budget -= n
            i += 1
        # Admit newcomers only when nothing had to be preempted: memory is tight otherwise, and the request just
        # preempted (now first in the queue) would be readmitted at once, to recompute what it gave back and be
        # preempted again.
        while self.waiting and not self.num_preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            scores = seq.params.prompt_logprobs is not None  # it needs every prompt row computed: nothing shared
            shared, forked = bm.fork_source(seq) if not scores else ([], 0)  # a sibling sample's prompt blocks
            if not forked and not scores and any(s in self.running and s.num_cached_tokens < s.num_prompt_tokens
                                                 for s in seq.group):
                break  # a sibling is computing the prompt: wait a step or a few, then share it (a fork)
            prefix = self.prefix_cache.lookup(seq) if self.prefix_cache is not None and not scores else []
            hits, cached = len(prefix), len(prefix) * bm.block_size
            if forked > cached:
                prefix, cached = shared, forked
            n = min(len(seq) - cached, budget)
            if n < len(seq) - cached and not self.chunked_prefill:
                break
            reserve = self.longest(seq) - cached if not self.preemption else n
            if not bm.can_allocate(reserve, prefix, cached):
                break
            self.waiting.popleft()
            bm.allocate(seq, prefix, cached)
            if self.prefix_cache is not None:
                self.prefix_cache.record(seq, hits)
            bm.append_slots(seq, reserve)  # without preemption: every block it can ever need, now
            seq.status = SequenceStatus.RUNNING
            seq.metrics.first_scheduled_time = seq.metrics.first_scheduled_time or time.perf_counter()
            self.running.append(seq)
            seqs.append(seq), lens.append(n)
            budget -= n
        return seqs, lens

    def longest(self, seq: Sequence) -> int:
        """The most tokens ``seq`` can ever hold: its prompt and every token it may still generate."""
        most = seq.num_prompt_tokens + seq.params.max_tokens
        return min(most, self.max_model_len) if self.max_model_len else most

    def postprocess(self, seqs: list[Sequence], lens: list[int], tokens: list[int | None]) -> None:
        """After a step: record what it computed and sampled, share what was filled, release what finished."""
        bm = self.block_manager
        finished = [seq for seq, n, token in zip(seqs, lens, tokens) if advance(seq, n, token)]
        if self.prefix_cache is not None:
            # Every block filled this step, of running and finished sequences alike: a request with the same start
            # admitted at the next step reuses it while its first owner still runs.
            for seq in seqs:
                self.prefix_cache.commit(seq, bm.table(seq))
        self.held_tokens = bm.filled_tokens(self.running)  # KV holding tokens at the step's end, before releases
        for seq in finished:
            bm.free_sequence(seq)
            self.running.remove(seq)

    def release_all(self) -> None:
        for seq in self.running:
            self.block_manager.free_sequence(seq)
        self.running.clear()
        self.waiting.clear()

"""Scheduling under a block budget: admit while blocks allow, preempt when they run out.

Every step has a token budget (``max_num_batched_tokens``). Running sequences go first, oldest first: a decode feeds
one token, a prompt still being prefilled feeds its next chunk (**chunked prefill**), so a long prompt never stalls
the decodes around it. Whatever budget is left admits waiting sequences, which first take any cached prefix blocks.
Each idea can be turned off, for the lesson: without chunked prefill a prompt waits until its whole rest fits one
step's budget; without preemption a request is admitted only with blocks reserved for the longest it can grow.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from common.engine import BlockState, EngineState, ScheduledBatch, SeqOutput, advance
from common.engine_config import SchedulerConfig
from common.sequence import Sequence, SequenceStatus
from common.validate import InvalidParam

from .block_manager import BlockManager
from .preemption import make_room


@dataclass
class Admission:
    """How a waiting sequence would start: the blocks it shares, the tokens they hold, what it feeds now."""
    prefix: list[int]  # blocks it shares (a cached prefix, or a sibling sample's prompt)
    cached: int  # tokens those blocks hold for it
    hit_blocks: int  # of them, found in the prefix cache (for the hit rate)
    num_tokens: int  # tokens it feeds this step
    reserve: int  # tokens it takes blocks for now (all it can ever need, without preemption)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.block_manager, self.prefix_cache = block_manager, block_manager.prefix_cache
        self.max_num_seqs, self.max_num_batched_tokens = config.max_num_seqs, config.max_num_batched_tokens
        self.chunked_prefill, self.preemption = config.enable_chunked_prefill, config.enable_preemption
        self.max_model_len = config.max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.preempted: list[Sequence] = []  # in the last step
        self.admitted: list[Sequence] = []  # in the last step
        self.prefix_hits: dict[int, int] = {}  # in the last step: seq_id -> prompt tokens found in the prefix cache
        self.held_tokens = 0  # KV positions holding tokens at the end of the last step
        self.num_in_step = 0  # sequences in flight during the last step, the ones it finished included

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_manager.num_blocks * self.block_manager.block_size

    def check(self, seq: Sequence) -> None:
        """A request the pool can never hold fails at submission, with what to change."""
        bm, n, cap = self.block_manager, seq.num_prompt_tokens, self.kv_capacity_tokens
        if n > cap:
            raise InvalidParam("prompt", f"the prompt has {n} tokens but the whole KV pool holds {cap} "
                               f"({bm.num_blocks} blocks of {bm.block_size}): shorten the prompt or raise "
                               f"kv_cache_memory")
        need = self.longest(seq)
        if need > cap:
            raise InvalidParam("max_tokens", f"the prompt ({n} tokens) plus max_tokens ({seq.params.max_tokens}) can "
                               f"need {need} tokens of KV but the whole pool holds {cap}: lower max_tokens to at most "
                               f"{cap - n} or raise kv_cache_memory")
        if not self.chunked_prefill and n > self.max_num_batched_tokens:
            raise InvalidParam("prompt", f"the prompt has {n} tokens but without chunked prefill a step holds at most "
                               f"max_num_batched_tokens={self.max_num_batched_tokens}: raise it or enable chunked "
                               f"prefill")

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """This step's sequences, how many tokens each feeds and their block tables; their blocks are allocated."""
        pc = self.prefix_cache
        queried = pc.queried_tokens if pc else 0
        seqs, lens = self.plan()
        self.num_in_step = len(self.running)
        bm = self.block_manager
        return ScheduledBatch(seqs, lens, [s.num_cached_tokens for s in seqs], tables=[bm.table(s) for s in seqs],
                              copies=bm.take_copies(), admitted=[s.seq_id for s in self.admitted],
                              preempted=[s.seq_id for s in self.preempted], prefix_hits=dict(self.prefix_hits),
                              prefix_query_tokens=pc.queried_tokens - queried if pc else 0)

    def plan(self) -> tuple[list[Sequence], list[int]]:
        """Pick this step's sequences and how many tokens each feeds; their blocks are allocated."""
        seqs, lens = [], []
        self.preempted, self.admitted, self.prefix_hits = [], [], {}
        budget = self.schedule_running(seqs, lens, self.max_num_batched_tokens)
        # Admit newcomers only when nothing was preempted: memory is tight, and the request just preempted (first in
        # the queue) would be readmitted at once, to recompute what it gave back and be preempted again.
        if not self.preempted:
            self.admit_waiting(seqs, lens, budget)
        return seqs, lens

    def schedule_running(self, seqs: list[Sequence], lens: list[int], budget: int) -> int:
        """The running sequences' next tokens, oldest first, the newest preempted when blocks run out; budget left."""
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self.chunk(seq, seq.num_new_tokens, budget)
            if n == 0:
                break  # the rest of this prompt waits for a step with room for all of it
            fits, victims = make_room(seq, n, self.running, self.waiting, self.block_manager)
            self.preempted += victims
            if not fits:
                break
            self.block_manager.append_slots(seq, n)
            seqs.append(seq), lens.append(n)
            budget -= n
            i += 1
        return budget

    def admit_waiting(self, seqs: list[Sequence], lens: list[int], budget: int) -> None:
        """Start waiting sequences in arrival order while the budget, the sequence limit and the blocks allow."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            plan = self.admission(seq, budget)
            if plan is None:
                break
            self.waiting.popleft()
            self.start(seq, plan)
            seqs.append(seq), lens.append(plan.num_tokens)
            budget -= plan.num_tokens

    def admission(self, seq: Sequence, budget: int) -> Admission | None:
        """How ``seq`` starts now (the longer of a sibling's prompt blocks and its cached prefix; a chunk), or None."""
        bm = self.block_manager
        if seq.params.prompt_logprobs is not None:  # it needs every prompt row computed: nothing shared
            prefix, cached, hits = [], 0, 0
        else:
            prefix, cached = bm.fork_source(seq)  # a sibling sample's prompt blocks
            if not cached and any(s in self.running and s.num_cached_tokens < s.num_prompt_tokens for s in seq.group):
                return None  # a sibling is computing the prompt: wait a step or a few, then share it (a fork)
            found = self.prefix_cache.lookup(seq) if self.prefix_cache is not None else []
            hits = len(found)
            if hits * bm.block_size >= cached:
                prefix, cached = found, hits * bm.block_size
        n = self.chunk(seq, len(seq) - cached, budget)
        if n == 0:
            return None
        reserve = n if self.preemption else self.longest(seq) - cached
        if not bm.can_allocate(reserve, prefix, cached):
            return None
        return Admission(prefix, cached, hits, n, reserve)

    def start(self, seq: Sequence, plan: Admission) -> None:
        """Give ``seq`` its shared blocks and room for what it feeds; it runs from this step on."""
        self.block_manager.allocate(seq, plan.prefix, plan.cached)
        if self.prefix_cache is not None:
            self.prefix_hits[seq.seq_id] = self.prefix_cache.record(seq, plan.hit_blocks)
        self.block_manager.append_slots(seq, plan.reserve)  # without preemption: every block it can ever need, now
        seq.status = SequenceStatus.RUNNING
        seq.metrics.first_scheduled_time = seq.metrics.first_scheduled_time or time.perf_counter()
        self.running.append(seq)
        self.admitted.append(seq)

    def chunk(self, seq: Sequence, remaining: int, budget: int) -> int:
        """Tokens ``seq`` feeds of ``remaining``: all if they fit, else the budget's worth (chunked prefill) or 0."""
        n = min(remaining, budget)
        return n if n == remaining or self.chunked_prefill else 0

    def longest(self, seq: Sequence) -> int:
        """The most tokens ``seq`` can ever hold: its prompt and every token it may still generate."""
        most = seq.num_prompt_tokens + seq.params.max_tokens
        return min(most, self.max_model_len) if self.max_model_len else most

    def postprocess(self, batch: ScheduledBatch, outputs: list[SeqOutput]) -> None:
        """After a step: record what it computed and sampled, share what was filled, release what finished."""
        bm, seqs = self.block_manager, batch.seqs
        for seq, n, out in zip(seqs, batch.lens, outputs):
            advance(seq, n, out)
            if out.drafted > out.accepted:  # the slots of draft tokens not kept go back (speculative decoding)
                bm.truncate(seq, seq.num_cached_tokens)
        if self.prefix_cache is not None:
            # Every block filled this step, of running and finished sequences alike: a request with the same start
            # admitted at the next step reuses it while its first owner still runs.
            for seq in seqs:
                self.prefix_cache.commit(seq, bm.table(seq))
        self.held_tokens = bm.filled_tokens(self.running)  # KV holding tokens at the step's end, before releases
        for seq in seqs:
            if seq.is_finished:
                bm.free_sequence(seq)
                self.running.remove(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is (a client gave up); its blocks go back to the pool."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self.block_manager.free_sequence(seq)
        if not seq.is_finished:
            seq.finish("abort")

    def release(self) -> None:
        for seq in self.running:
            self.block_manager.free_sequence(seq)
        self.running.clear()
        self.waiting.clear()

    def state(self, cache) -> EngineState:
        """The pool after the step: blocks held (cached ones among the free), and KV holding tokens."""
        bm, pc, per_token = self.block_manager, self.prefix_cache, cache.bytes_per_token
        cached = [b for b in pc.of_block if bm.blocks[b].ref_count == 0] if pc else []
        blocks = BlockState(bm.num_blocks, bm.block_size, bm.num_free_blocks,
                            {seq_id: list(t) for seq_id, t in bm.tables.items()}, cached)
        return EngineState(self.max_num_seqs, self.num_in_step, len(self.running), len(self.waiting),
                           bm.num_used_blocks * bm.block_size * per_token, self.held_tokens * per_token, blocks)

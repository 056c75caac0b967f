"""A state machine over the block manager: allocate, grow, share a prefix, finish, preempt, evict.

A shadow copy of what each block holds (written as the engine would write KV) is the
oracle: whatever a sequence reads through its block table must be its own tokens.
"""
import importlib

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from common import SamplingParams, Sequence
from workloads import examples

paged = importlib.import_module("stages.03_paged_kv")
BlockManager, PrefixCache = paged.BlockManager, paged.PrefixCache
BLOCK_SIZE, NUM_BLOCKS = 4, 14
SYSTEM_PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 50, 60, 70, 80]]  # share their first block
tokens = st.lists(st.integers(1, 99), min_size=1, max_size=12)


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.cache = PrefixCache(BLOCK_SIZE)
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE, self.cache)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.written: dict[tuple[int, int], int] = {}  # (block, offset) -> token whose KV is there

    def write(self, seq: Sequence, n: int) -> None:
        """What a step does: allocate room, write n tokens' KV, mark them cached, share full blocks."""
        self.bm.append_slots(seq, n)
        for p in range(seq.num_cached_tokens, seq.num_cached_tokens + n):
            self.written[self.bm.table(seq)[p // BLOCK_SIZE], p % BLOCK_SIZE] = seq.token_ids[p]
        seq.num_cached_tokens += n
        self.cache.commit(seq, self.bm.table(seq))

    def release(self, seq: Sequence) -> None:
        """Free a finishing or preempted sequence's blocks: the ones nobody else holds join the free list's end (the
        last evicted) from its last block to its first, so its head, which a later request can share, outlives its
        tail, useless without it."""
        table = self.bm.table(seq)
        alone = [b for b in table if self.bm.blocks[b].ref_count == 1]
        self.bm.free_sequence(seq)
        assert list(self.bm.free)[len(self.bm.free) - len(alone):] == alone[::-1]

    @rule(system=st.sampled_from(SYSTEM_PROMPTS + [[]]), tail=tokens)
    def new_request(self, system, tail):
        self.waiting.append(Sequence(system + tail, SamplingParams(max_tokens=99), 0, torch.device("cpu")))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), tail=tokens)
    def fork_a_running_prefix(self, data, tail):
        parent = data.draw(st.sampled_from(self.running))
        cut = data.draw(st.integers(1, len(parent)))
        self.waiting.append(Sequence(parent.token_ids[:cut] + tail, SamplingParams(max_tokens=99), 0,
                                     torch.device("cpu")))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def admit(self, data):
        seq = data.draw(st.sampled_from(self.waiting))
        prefix = self.cache.lookup(seq)
        for i, block_id in enumerate(prefix):  # a hit must hold exactly this sequence's tokens
            for off in range(BLOCK_SIZE):
                assert self.written[block_id, off] == seq.token_ids[i * BLOCK_SIZE + off]
        n = len(seq) - len(prefix) * BLOCK_SIZE
        if not self.bm.can_allocate(n, prefix):
            return
        self.waiting.remove(seq)
        self.bm.allocate(seq, prefix)
        self.write(seq, n)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=st.integers(1, 99))
    def decode(self, data, token):
        seq = data.draw(st.sampled_from(self.running))
        seq.output_token_ids.append(token)
        if self.bm.can_append(seq, 1):
            self.write(seq, 1)
        else:  # out of blocks: preempt it (recomputed later), as the scheduler would
            self.release(seq)
            self.running.remove(seq)
            self.waiting.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        seq = data.draw(st.sampled_from(self.running))
        self.release(seq)
        self.running.remove(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data):
        seq = data.draw(st.sampled_from(self.running))
        self.release(seq)
        self.running.remove(seq)
        self.waiting.append(seq)

    @invariant()
    def the_accounting_holds(self):
        self.bm.audit(self.running)  # reference counts, the free list, blocks for the computed tokens
        for seq in self.running:
            assert len(self.bm.table(seq)) == -(-seq.num_cached_tokens // BLOCK_SIZE)

    @invariant()
    def sharing_is_through_full_cached_blocks(self):
        for b in self.bm.blocks:
            assert b.ref_count <= 1 or len(self.cache.of_block[b.block_id][1]) == BLOCK_SIZE

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        for seq in self.running:
            for p in range(seq.num_cached_tokens):
                assert self.written[self.bm.table(seq)[p // BLOCK_SIZE], p % BLOCK_SIZE] == seq.token_ids[p]

    @invariant()
    def cache_index_points_at_matching_blocks(self):
        for h, block_id in self.cache.by_hash.items():
            assert self.cache.of_block[block_id][0] == h
        for block_id in self.cache.of_block:  # a cached block's contents are still there: never handed out again
            assert block_id in self.bm.free or self.bm.blocks[block_id].ref_count > 0

    def teardown(self):
        for seq in self.running:
            self.bm.free_sequence(seq)
        assert self.bm.num_free_blocks == NUM_BLOCKS
        self.bm.audit([])


BlockManagerMachine.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=40, deadline=None)
TestBlockManager = BlockManagerMachine.TestCase

"""KV memory as a pool of fixed-size blocks (PagedAttention, Kwon et al., SOSP 2023).

A sequence owns a *block table*: the ids of the blocks that hold its keys and
values, in order. Blocks are taken from a free list as the sequence grows and
go back when it finishes or is preempted, so memory held tracks tokens
written, not the longest a request might become.

Prefix caching: once a block is full, it gets a hash chained over the previous
block's hash and its own token ids, so equal hashes mean equal prefixes. A new
sequence whose prompt starts with cached blocks shares them (reference counts)
instead of recomputing them. A freed block keeps its hash and contents while it
sits in the free list; it is only overwritten when the free list hands it out
again, least recently freed first (LRU eviction).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from common.sequence import Sequence


def chain_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """A full block's identity: its tokens and, through ``parent``, every token before them."""
    return hashlib.sha256((parent or b"") + np.asarray(token_ids, dtype=np.int64).tobytes()).digest()


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and its KV computed
    token_ids: list[int] = field(default_factory=list)  # kept to rule out hash collisions


class NoFreeBlocks(Exception):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, hash_fn=chain_hash):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU first
        self.cached: dict[bytes, int] = {}  # hash -> block id, for full blocks (in use or free)
        self.hash_fn = hash_fn
        self.hit_tokens = 0  # prompt tokens found in the cache
        self.queried_tokens = 0  # prompt tokens looked up

    # ---- accounting -----------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody references (cached ones among them can still be revived)."""
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache -----------------------------------------------------------------
    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Ids of cached blocks that hold a prefix of ``seq``'s tokens.

        At most ``(len(seq) - 1) // block_size`` blocks: the last token is always computed,
        because its logits give the next token (a fully cached prompt still runs one token)."""
        ids, parent, tokens = [], None, seq.token_ids
        for i in range((len(tokens) - 1) // self.block_size):
            chunk = tokens[i * self.block_size:(i + 1) * self.block_size]
            h = self.hash_fn(parent, chunk)
            block_id = self.cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != chunk:  # miss, or a collision
                break
            ids.append(block_id)
            parent = h
        return ids

    def can_allocate(self, seq: Sequence, num_tokens: int, prefix: list[int]) -> bool:
        """Can ``seq`` (holding nothing) take ``prefix`` and room for ``num_tokens`` more tokens?"""
        revived = sum(1 for b in prefix if self.blocks[b].ref_count == 0)  # they leave the free list
        fresh = self.blocks_for(len(prefix) * self.block_size + num_tokens) - len(prefix)
        return revived + fresh <= self.num_free_blocks

    def allocate(self, seq: Sequence, prefix: list[int]) -> None:
        """Give a waiting sequence its cached prefix; its other tokens will be computed."""
        assert not seq.block_table, "sequence already holds blocks"
        for block_id in prefix:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        seq.block_table = list(prefix)
        seq.num_cached_tokens = len(prefix) * self.block_size
        self.queried_tokens += seq.num_prompt_tokens
        self.hit_tokens += min(seq.num_cached_tokens, seq.num_prompt_tokens)

    # ---- growth -----------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks ``seq`` needs to write ``num_tokens`` more tokens."""
        return max(0, self.blocks_for(seq.num_cached_tokens + num_tokens) - len(seq.block_table))

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_tokens: int) -> None:
        for _ in range(self.blocks_needed(seq, num_tokens)):
            seq.block_table.append(self._take_free_block())

    def _take_free_block(self) -> int:
        if not self.free:
            raise NoFreeBlocks("no free KV block")
        block_id, _ = self.free.popitem(last=False)  # least recently freed: the LRU eviction
        block = self.blocks[block_id]
        if block.hash is not None and self.cached.get(block.hash) == block_id:
            del self.cached[block.hash]  # evicted: its old contents are about to be overwritten
        block.hash, block.token_ids, block.ref_count = None, [], 1
        return block_id

    def commit(self, seq: Sequence) -> None:
        """After a step: hash the blocks ``seq`` has filled, so later requests can share them."""
        parent = None
        for i in range(seq.num_cached_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.token_ids = seq.token_ids[i * self.block_size:(i + 1) * self.block_size]
                block.hash = self.hash_fn(parent, block.token_ids)
                self.cached.setdefault(block.hash, block.block_id)  # an equal block may already be cached
            parent = block.hash

    # ---- release ----------------------------------------------------------------------
    def free_sequence(self, seq: Sequence) -> None:
        """Return a finished or preempted sequence's blocks; cached ones stay revivable."""
        for block_id in reversed(seq.block_table):  # the tail is evicted before the shared head
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table = []
        seq.num_cached_tokens = 0

    def filled_tokens(self, seqs: list[Sequence]) -> int:
        """Distinct token positions holding KV across ``seqs`` (a shared block counts once)."""
        filled: dict[int, int] = {}
        for seq in seqs:
            for i, block_id in enumerate(seq.block_table):
                n = min(self.block_size, seq.num_cached_tokens - i * self.block_size)
                filled[block_id] = max(filled.get(block_id, 0), n)
        return sum(filled.values())

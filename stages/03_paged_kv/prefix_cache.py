"""Prefix caching: a request whose prompt starts like an earlier one reuses its KV blocks.

Once a block is full, it gets a hash chained over the previous block's hash and its own token ids, so equal hashes
mean equal prefixes (the whole prompt up to there, not just the block). A new sequence looks its prompt up block by
block and shares what it finds instead of recomputing it. A freed block keeps its hash and contents while it sits in
the free list; it is forgotten only when the block manager hands it out again (LRU eviction). The tokens are
compared on every hit, so a hash collision is a miss, never a wrong block.
"""
from __future__ import annotations

import hashlib

import numpy as np

from common.sequence import Sequence


def chain_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """A full block's identity: its tokens and, through ``parent``, every token before them."""
    # lab 03.4 begin: the prefix-cache hash chain
    return hashlib.sha256((parent or b"") + np.asarray(token_ids, dtype=np.int64).tobytes()).digest()
    # lab 03.4 end


class PrefixCache:
    def __init__(self, block_size: int, hash_fn=chain_hash):
        self.block_size, self.hash_fn = block_size, hash_fn
        self.by_hash: dict[bytes, int] = {}  # hash -> the block holding that prefix (in use or free)
        self.of_block: dict[int, tuple[bytes, list[int]]] = {}  # block id -> (its hash, its token ids)
        self.hit_tokens = 0  # prompt tokens found in the cache
        self.queried_tokens = 0  # prompt tokens looked up

    def lookup(self, seq: Sequence) -> list[int]:
        """Ids of cached blocks that hold a prefix of ``seq``'s tokens.

        At most ``(len(seq) - 1) // block_size`` blocks: the last token is always computed,
        because its logits give the next token (a fully cached prompt still runs one token)."""
        ids, parent, tokens, bs = [], None, seq.token_ids, self.block_size
        for i in range((len(tokens) - 1) // bs):
            chunk = tokens[i * bs:(i + 1) * bs]
            h = self.hash_fn(parent, chunk)
            block_id = self.by_hash.get(h)
            if block_id is None or self.of_block[block_id][1] != chunk:  # a miss, or a collision
                break
            ids.append(block_id)
            parent = h
        return ids

    def record(self, seq: Sequence, hit_blocks: int) -> int:
        """Count an admitted prompt's lookup for the hit rate; returns the prompt tokens it found."""
        found = min(hit_blocks * self.block_size, seq.num_prompt_tokens)
        self.queried_tokens += seq.num_prompt_tokens
        self.hit_tokens += found
        return found

    def commit(self, seq: Sequence, table: list[int]) -> None:
        """After a step: hash the blocks ``seq`` has filled, so later requests can share them."""
        parent, bs = None, self.block_size
        for i in range(seq.num_cached_tokens // bs):
            block_id = table[i]
            if block_id not in self.of_block:
                tokens = seq.token_ids[i * bs:(i + 1) * bs]
                h = self.hash_fn(parent, tokens)
                self.of_block[block_id] = (h, tokens)
                self.by_hash.setdefault(h, block_id)  # an equal block may already be cached
            parent = self.of_block[block_id][0]

    def evict(self, block_id: int) -> None:
        """The block is being handed out again: what it held is no longer there to share."""
        entry = self.of_block.pop(block_id, None)
        if entry is not None and self.by_hash.get(entry[0]) == block_id:
            del self.by_hash[entry[0]]

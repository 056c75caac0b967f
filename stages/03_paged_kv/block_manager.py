"""Paging: KV memory as a pool of fixed-size blocks (PagedAttention, Kwon et al., SOSP 2023).

A sequence owns a *block table*: the ids of the blocks that hold its keys and values, in order. Blocks are taken
from a free list as the sequence grows and go back when it finishes or is preempted, so memory held tracks tokens
written, not the longest a request might become. A block can be shared (its reference count says by how many
sequences): that is how the prefix cache (``prefix_cache.py``) lets requests reuse each other's prompts, and how the
n samples of one request (SamplingParams.n) share their prompt: a sample *forks* a sibling's prompt blocks, the last
one partial, and the first write into a block someone else still holds copies it first (copy-on-write, section 4.4).
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from common.sequence import Sequence

from .prefix_cache import PrefixCache


@dataclass
class Block:
    block_id: int
    ref_count: int = 0


class NoFreeBlocks(Exception):
    pass


class AuditError(AssertionError):
    """The block accounting is broken: what `BlockManager.audit` found, in words."""


class BlockManager:
    """The pool's accounting. Of a sequence it writes one field, ``num_cached_tokens``, kept equal to the positions
    its blocks hold for it when it takes, frees or gives back blocks."""

    def __init__(self, num_blocks: int, block_size: int, prefix_cache: PrefixCache | None = None):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Least recently freed first: the next block handed out, and so the first cached one evicted.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.tables: dict[int, list[int]] = {}  # seq_id -> the blocks holding its tokens, in position order
        self.prefix_cache = prefix_cache
        self.copies: list[tuple[int, int]] = []  # copy-on-write (source, destination) pairs the cache must copy

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

    def table(self, seq: Sequence) -> list[int]:
        return self.tables.get(seq.seq_id, [])

    # ---- admission ------------------------------------------------------------------
    def can_allocate(self, num_tokens: int, prefix: list[int], cached: int | None = None) -> bool:
        """Can a sequence holding nothing take the cached blocks ``prefix`` and room for ``num_tokens`` more tokens?
        ``cached``: the tokens ``prefix`` holds, when its last block is partial (a fork) and so copied on write."""
        cached = len(prefix) * self.block_size if cached is None else cached
        revived = sum(1 for b in prefix if self.blocks[b].ref_count == 0)  # they leave the free list
        fresh = self.blocks_for(cached + num_tokens) - len(prefix)
        copy = int(cached % self.block_size != 0 and num_tokens > 0)  # a sibling holds the partial block
        return revived + fresh + copy <= self.num_free_blocks

    def fork_source(self, seq: Sequence) -> tuple[list[int], int]:
        """A sibling sample's blocks holding ``seq``'s prompt but its last token (whose logits give the sample's own
        first token; all of it after a preemption), and how many tokens they hold; ([], 0) when none has them yet."""
        want = min(seq.num_prompt_tokens, len(seq) - 1)
        for other in seq.group:
            if other is not seq and other.seq_id in self.tables and other.num_cached_tokens >= want > 0:
                return self.tables[other.seq_id][:self.blocks_for(want)], want
        return [], 0

    def allocate(self, seq: Sequence, prefix: list[int], cached: int | None = None) -> None:
        """Give a waiting sequence its cached prefix blocks (shared); its other tokens will be computed."""
        assert seq.seq_id not in self.tables, "sequence already holds blocks"
        # lab 03.1 begin: allocate shared prefix blocks
        for block_id in prefix:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        self.tables[seq.seq_id] = list(prefix)
        # lab 03.1 end
        seq.num_cached_tokens = len(prefix) * self.block_size if cached is None else cached

    # ---- growth -----------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks ``seq`` needs to hold ``num_tokens`` more tokens than it has computed."""
        return max(0, self.blocks_for(seq.num_cached_tokens + num_tokens) - len(self.table(seq))) \
            + int(self.shared_write_block(seq, num_tokens) is not None)

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Make room for ``num_tokens`` more of ``seq``'s tokens (a block at a time, as they are needed)."""
        self.copy_on_write(seq, num_tokens)
        # lab 03.2 begin: append blocks as a sequence grows
        table = self.tables.setdefault(seq.seq_id, [])
        for _ in range(self.blocks_needed(seq, num_tokens)):
            table.append(self._take_free_block())
        # lab 03.2 end

    def copy_on_write(self, seq: Sequence, num_tokens: int) -> None:
        """If the block ``seq``'s next write lands in is held by a sibling sample too, give ``seq`` a copy of it."""
        table = self.tables.setdefault(seq.seq_id, [])
        i = self.shared_write_block(seq, num_tokens)
        if i is not None:
            source, table[i] = table[i], self._take_free_block()
            self.blocks[source].ref_count -= 1
            self.copies.append((source, table[i]))

    def shared_write_block(self, seq: Sequence, num_tokens: int) -> int | None:
        """Where in ``seq``'s table its next write lands in a partial block another sequence holds too, or None.
        Only a fork shares a partial block (the prefix cache shares full ones, never written again)."""
        table, cached = self.table(seq), seq.num_cached_tokens
        i = cached // self.block_size
        if num_tokens > 0 and cached % self.block_size and i < len(table) and self.blocks[table[i]].ref_count > 1:
            return i
        return None

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write pairs since the last call: the cache copies them before the step writes."""
        copies, self.copies = self.copies, []
        return copies

    def _take_free_block(self) -> int:
        if not self.free:
            raise NoFreeBlocks("no free KV block")
        block_id, _ = self.free.popitem(last=False)
        if self.prefix_cache is not None:
            self.prefix_cache.evict(block_id)  # its old contents are about to be overwritten
        self.blocks[block_id].ref_count = 1
        return block_id

    # ---- release ----------------------------------------------------------------------
    def free_sequence(self, seq: Sequence) -> None:
        """Return a finished or preempted sequence's blocks; cached ones stay revivable until handed out again.
        Tail first: the free list hands out (and so evicts) its least recently freed block first, and a cached block
        is useful only if every block before it is still cached too. Freed head first, the next allocation would
        evict the head and leave the rest of its chain cached but unreachable."""
        # lab 03.3 begin: free with reference counts
        for block_id in reversed(self.tables.pop(seq.seq_id, [])):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free[block_id] = None
        # lab 03.3 end
        seq.num_cached_tokens = 0

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep ``seq``'s first ``num_tokens`` slots and give back the rest: a rejected draft's slots (stage 06).
        Whole blocks past them return to the pool, tail first. The last block kept is partial when ``num_tokens``
        ends inside it, and its later slots will be written again: a block the prefix cache knows is forgotten there
        first, unless another sequence holds it too (then the next write copies it, and the cached one stays)."""
        table = self.tables.get(seq.seq_id, [])
        keep = self.blocks_for(num_tokens)
        for block_id in reversed(table[keep:]):
            self._release(block_id)
        del table[keep:]
        seq.num_cached_tokens = min(seq.num_cached_tokens, num_tokens)
        if num_tokens % self.block_size and table and self.blocks[table[-1]].ref_count == 1 and self.prefix_cache:
            self.prefix_cache.evict(table[-1])

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed twice"
        if block.ref_count == 0:
            self.free[block_id] = None

    def audit(self, running: list[Sequence]) -> None:
        """Check the accounting after a step (`AuditError` says what is wrong): reference counts equal the block
        tables holding each block, the free list is the unreferenced blocks, each running sequence holds blocks for
        its computed tokens, and a block past them holds no cached prefix unless shared (its slots await a write)."""
        held = Counter(b for table in self.tables.values() for b in table)
        for seq_id, table in self.tables.items():
            if len(set(table)) != len(table):
                raise AuditError(f"sequence {seq_id}'s block table {table} holds a block twice")
        for block in self.blocks:
            if block.ref_count != held[block.block_id]:
                raise AuditError(f"block {block.block_id} has ref_count {block.ref_count} but "
                                 f"{held[block.block_id]} block tables hold it")
            if (block.block_id in self.free) != (block.ref_count == 0):
                raise AuditError(f"block {block.block_id} is {'on' if block.block_id in self.free else 'off'} the "
                                 f"free list with ref_count {block.ref_count} (block tables: {dict(self.tables)})")
        for seq in running:
            table = self.table(seq)
            if len(table) * self.block_size < seq.num_cached_tokens:
                raise AuditError(f"a request with {seq.num_cached_tokens} computed tokens holds {len(table)} "
                                 f"blocks of {self.block_size}")
            full = seq.num_cached_tokens // self.block_size
            cached = [b for b in table[full:] if self.prefix_cache and b in self.prefix_cache.of_block
                      and self.blocks[b].ref_count == 1]
            if cached:
                raise AuditError(f"sequence {seq.seq_id} holds cached block(s) {cached} past its "
                                 f"{seq.num_cached_tokens} computed tokens")

    def filled_tokens(self, seqs: list[Sequence]) -> int:
        """Distinct token positions holding KV across ``seqs`` (a shared block counts once)."""
        filled: dict[int, int] = {}
        for seq in seqs:
            for i, block_id in enumerate(self.table(seq)):
                n = min(self.block_size, seq.num_cached_tokens - i * self.block_size)
                filled[block_id] = max(filled.get(block_id, 0), n)
        return sum(filled.values())

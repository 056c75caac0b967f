"""Labs 01-03: scheduling (static, continuous) and the paged KV cache, each task with its planted wrong answer."""
from __future__ import annotations

from .task import S01, S02, S03, Lab, Task

LABS_01_03 = [
    Lab("01", "01_static_batch", f"{S01}/README.md#what-the-code-does", (
        Task("01.1", "the static scheduler", f"{S01}/engine.py",
             "Scheduler.pick: when every request of the current batch has finished, take the next batch (up to "
             "max_num_seqs waiting requests, in arrival order, marked RUNNING); return the slots of the batch's "
             "unfinished requests and whether the batch is new. A finished request keeps its slot, idle.",
             "Static (request-level) batching, as Orca describes what it replaces: a batch is scheduled as a whole "
             "and runs until every request in it has finished (Yu et al., OSDI 2022, paraphrased).",
             "The batch is new exactly when none of its requests is unfinished (an empty batch counts). "
             "The toy run (8 requests, 4 slots) must take 160 steps.",
             ("new = not self.batch or (any(s.is_finished for s in self.batch) and bool(self.waiting))\n"
              "if new:\n"
              "    self.batch = [self.waiting.popleft() for _ in range(min(self.max_num_seqs, len(self.waiting)))]\n"
              "    now = time.perf_counter()\n"
              "    for seq in self.batch:\n"
              "        seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, now\n"
              "return [i for i, s in enumerate(self.batch) if not s.is_finished], new\n",),
             "starts the next batch as soon as one request ends, dropping the unfinished rest"),
    )),
    Lab("02", "02_continuous_batch", f"{S02}/README.md#what-the-code-does", (
        Task("02.1", "refill free slots", f"{S02}/engine.py",
             "Scheduler.schedule: before every step, give each free slot (None) the next waiting request, in "
             "arrival order, and mark it RUNNING with its first_scheduled_time.",
             "Orca's iteration-level scheduling: the scheduler schedules execution at the granularity of an "
             "iteration instead of a request, so a finished request leaves and a new one joins at the next "
             "iteration (Yu et al., OSDI 2022).",
             "Every free slot, not just one, while requests wait. The toy run must take 112 steps (stage 01: 160).",
             ("for i, seq in enumerate(self.slots):\n"
              "    if seq is None and self.waiting:\n"
              "        seq = self.slots[i] = self.waiting.popleft()\n"
              "        seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, now\n"
              "        break\n",),
             "refills one slot per step"),
    )),
    Lab("03", "03_paged_kv", f"{S03}/README.md#what-the-code-does", (
        Task("03.1", "allocate shared prefix blocks", f"{S03}/block_manager.py",
             "BlockManager.allocate: give a waiting sequence the cached blocks `prefix` (shared): each one's "
             "reference count goes up, a block nobody referenced leaves the free list, and the sequence's block "
             "table starts as those blocks.",
             "PagedAttention keeps a sequence's KV in blocks mapped through a block table, and blocks can be shared "
             "within and across requests, counted by reference (Kwon et al., SOSP 2023, paraphrased).",
             "A cached block with ref_count 0 is still in self.free: take it out, or it is handed out twice.",
             ("for block_id in prefix:\n"
              "    self.blocks[block_id].ref_count += 1\n"
              "self.tables[seq.seq_id] = list(prefix)\n",),
             "revives a cached block without taking it off the free list"),
        Task("03.2", "append blocks as a sequence grows", f"{S03}/block_manager.py",
             "BlockManager.append_slots: make room for num_tokens more tokens of seq, taking as many free blocks "
             "as it needs (blocks_needed, _take_free_block) onto the end of its table.",
             "Memory held tracks tokens written: a block is taken from the free list only when a sequence's last "
             "block is full (Kwon et al., SOSP 2023, paraphrased).",
             "A prefill chunk can need several blocks at once.",
             ("table = self.tables.setdefault(seq.seq_id, [])\n"
              "if self.blocks_needed(seq, num_tokens):\n"
              "    table.append(self._take_free_block())\n",),
             "takes one block per call, whatever the step needs"),
        Task("03.3", "free with reference counts", f"{S03}/block_manager.py",
             "BlockManager.free_sequence: drop the sequence's table; each of its blocks loses a reference, and a "
             "block nobody references any more goes back on the free list (tail first, so the shared head is "
             "evicted last).",
             "A shared block is returned to the pool only when its reference count drops to zero (Kwon et al., "
             "SOSP 2023, paraphrased).",
             "Another sequence may still hold the block: look at ref_count before freeing it.",
             ("for block_id in reversed(self.tables.pop(seq.seq_id, [])):\n"
              "    self.blocks[block_id].ref_count = max(0, self.blocks[block_id].ref_count - 1)\n"
              "    self.free[block_id] = None\n",),
             "puts a block back on the free list while another sequence still references it"),
        Task("03.4", "the prefix-cache hash chain", f"{S03}/prefix_cache.py",
             "chain_hash: a full block's identity, from its own token ids and its parent block's hash, so that "
             "equal hashes mean equal prefixes (the whole prompt up to there).",
             "vLLM's automatic prefix caching identifies a KV block by a hash of its tokens and of every token "
             "before it in the sequence (vLLM docs, paraphrased).",
             "The same 4 tokens at position 0 and at position 4 are different blocks: their keys carry their "
             "positions (RoPE).",
             ("return hashlib.sha256(np.asarray(token_ids, dtype=np.int64).tobytes()).digest()\n",),
             "hashes a block's own tokens only, not the chain before it"),
        Task("03.5", "preempt a request", f"{S03}/preemption.py",
             "preempt: a running request gives its blocks back (recompute preemption): free them, mark it "
             "WAITING and put it at the front of the queue, to be recomputed when blocks allow.",
             "vLLM's recompute preemption: when blocks run out, the most recently admitted request is evicted and "
             "its KV recomputed when it is rescheduled (Kwon et al., SOSP 2023, paraphrased).",
             "Nothing is lost but time: free_sequence returns its blocks; appendleft keeps its turn.",
             ("seq.status = SequenceStatus.WAITING\n"
              "waiting.appendleft(seq)\n",),
             "preempts a request without freeing its blocks (they leak)"),
    )),
]

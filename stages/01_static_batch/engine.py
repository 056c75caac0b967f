"""Stage 01: static batching.

Take up to ``max_num_seqs`` waiting requests in arrival order, prefill them together, then
decode one token per request per step until the *longest* one ends. Requests that finish
early keep their slot and sit idle: that waste is the lesson, and the statistics count it
(slot utilization).

The engine is the shared loop (common/engine.py) over three parts: this stage's `Scheduler`,
a `BatchCache` (a contiguous buffer per batch, padded to the longest the batch can grow to),
and the shared `ModelRunner`.
"""
from __future__ import annotations

import time
from collections import deque

from common.engine import EngineState, LLMEngine, ScheduledBatch, SeqOutput, advance
from common.engine_config import EngineConfig
from common.kv_cache import ContiguousKVCache, slots_for_budget
from common.llm import LLM as FrontEnd
from common.model import Llama
from common.runner import ModelRunner
from common.sequence import Sequence, SequenceStatus


class Scheduler:
    """Hands out whole batches: the next batch starts only when every request of the last one is done."""

    def __init__(self, max_num_seqs: int):
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.batch: list[Sequence] = []  # the current batch; a request keeps its slot (its index) to the end
        self.ran: list[Sequence] = []  # the requests of the last step

    def check(self, seq: Sequence) -> None:
        pass  # anything the front end accepts fits a batch's buffer

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.is_finished for s in self.batch)

    @property
    def num_running(self) -> int:
        return sum(not s.is_finished for s in self.batch)

    def schedule(self) -> ScheduledBatch:
        """Every unfinished request of the batch, in its slot; a new batch when the last one is done."""
        slots, new = self.pick()
        self.ran = seqs = [self.batch[i] for i in slots]
        return ScheduledBatch(seqs, [s.num_new_tokens for s in seqs], [s.num_cached_tokens for s in seqs], slots=slots,
                              new_batch=new, admitted=[s.seq_id for s in seqs if s.num_cached_tokens == 0])

    def pick(self) -> tuple[list[int], bool]:
        """The slots to run this step (every unfinished request of the batch), and whether the batch is new."""
        # lab 01.1 begin: the static scheduler
        new = not any(not s.is_finished for s in self.batch)
        if new:
            self.batch = [self.waiting.popleft() for _ in range(min(self.max_num_seqs, len(self.waiting)))]
            now = time.perf_counter()
            for seq in self.batch:
                seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, now
        return [i for i, s in enumerate(self.batch) if not s.is_finished], new
        # lab 01.1 end

    def postprocess(self, batch: ScheduledBatch, outputs: list[SeqOutput]) -> None:
        """Record what the step computed and sampled; a finished request's slot stays taken until the batch ends."""
        for seq, n, out in zip(batch.seqs, batch.lens, outputs):
            advance(seq, n, out)

    def release(self) -> None:
        self.waiting.clear()
        self.batch = []

    def state(self, cache: BatchCache) -> EngineState:
        """The batch's slots; KV reserved for all of them, KV used by the requests that ran (idle slots are waste)."""
        used = sum(s.num_cached_tokens for s in self.ran) * cache.bytes_per_token
        return EngineState(len(self.batch), len(self.ran), self.num_running, len(self.waiting), cache.reserved_bytes,
                           used)


class BatchCache:
    """A contiguous KV buffer per static batch, padded to the longest the batch's requests can grow to."""

    def __init__(self, model: Llama, max_model_len: int):
        self.model, self.max_model_len = model, max_model_len
        self.bytes_per_token = model.config.kv_bytes_per_token(model.dtype.itemsize)
        self.buffer: ContiguousKVCache | None = None

    @property
    def reserved_bytes(self) -> int:
        return self.buffer.reserved_bytes if self.buffer is not None else 0

    def prepare_step(self, batch: ScheduledBatch) -> None:
        if batch.new_batch:
            longest = max(min(len(s) + s.params.max_tokens, self.max_model_len) for s in batch.seqs)
            self.buffer = ContiguousKVCache(self.model.config, len(batch.seqs), longest, self.model.dtype,
                                            self.model.device, self.model.batch_invariant)
        self.buffer.prepare_step(batch)

    def __call__(self, layer, q, k, v):
        return self.buffer(layer, q, k, v)


def build(config: EngineConfig, tokenizer=None) -> LLMEngine:
    """Stage 01's engine: the shared loop over a static scheduler and a buffer per batch."""
    model = config.model.load(Llama)  # common/model.py
    slots = slots_for_budget(config, model)  # as many slots as the KV budget holds, at most max_num_seqs
    return LLMEngine(model, Scheduler(slots), BatchCache(model, config.model.max_model_len), ModelRunner(model))


class LLM(FrontEnd):
    build = staticmethod(build)

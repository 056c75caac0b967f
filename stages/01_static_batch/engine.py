"""Stage 01: static batching.

Take up to ``max_num_seqs`` waiting requests in arrival order, prefill them together, then
decode one token per request per step until the *longest* one ends. Requests that finish
early keep their slot and sit idle: that waste is the lesson, and the statistics count it
(slot utilization).
"""
from __future__ import annotations

import time
from collections import deque

from common.engine import EngineState, SeqOutput, StepResult, advance
from common.kv_cache import ContiguousKVCache
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

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.is_finished for s in self.batch)

    @property
    def num_running(self) -> int:
        return sum(not s.is_finished for s in self.batch)

    def schedule(self) -> tuple[list[int], bool]:
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

    def postprocess(self, slots: list[int], lens: list[int], outputs: list[SeqOutput]) -> None:
        """Record what the step computed and sampled; a finished request's slot stays taken until the batch ends."""
        for i, n, out in zip(slots, lens, outputs):
            advance(self.batch[i], n, out)


class LLMEngine:
    model_class, scheduler_class = Llama, Scheduler  # stage 02 swaps the scheduler

    def __init__(self, model: Llama, *, max_model_len: int, max_num_seqs: int):
        self.model, self.max_model_len = model, max_model_len
        self.runner = ModelRunner(model)
        self.scheduler = self.scheduler_class(max_num_seqs)
        self.cache: ContiguousKVCache | None = None
        self.ran: list[Sequence] = []  # the requests of the last step

    def check(self, seq: Sequence) -> None:
        pass

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> StepResult:
        slots, new_batch = self.scheduler.schedule()
        batch = self.scheduler.batch
        if new_batch:  # one buffer for the batch, padded to the longest the batch's requests can grow to
            max_len = max(min(len(s) + s.params.max_tokens, self.max_model_len) for s in batch)
            self.cache = ContiguousKVCache(self.model.config, len(batch), max_len, self.model.dtype,
                                           self.model.device, self.model.batch_invariant)
        return self.run(slots, [batch[i] for i in slots])

    def run(self, slots: list[int], seqs: list[Sequence]) -> StepResult:
        """Run one step of ``seqs`` (in these cache slots), then let the scheduler record what it produced."""
        self.ran = seqs
        # A request's first step feeds its whole prompt (prefill); later ones their last token (decode).
        lens, starts = [s.num_new_tokens for s in seqs], [s.num_cached_tokens for s in seqs]
        admitted = [s.seq_id for s in seqs if s.num_cached_tokens == 0]  # nothing cached yet: its first step
        self.cache.prepare(slots, lens, [len(s) + len(s.spec_token_ids) for s in seqs])
        outputs = self.runner.run(seqs, lens, self.cache)
        self.scheduler.postprocess(slots, lens, outputs)
        return StepResult(seqs, lens, starts, outputs, slots=slots, admitted=admitted)

    def release(self) -> None:
        self.scheduler.waiting.clear()
        self.scheduler.batch, self.cache = [], None

    # ---- the state the observers read after each step ---------------------------------------
    def state(self) -> EngineState:
        return EngineState(self.num_slots, len(self.ran), self.scheduler.num_running, len(self.scheduler.waiting),
                           self.kv_bytes_reserved(), self.kv_bytes_used())

    @property
    def num_slots(self) -> int:
        return len(self.scheduler.batch)

    def kv_bytes_reserved(self) -> int:
        return self.cache.reserved_bytes if self.cache is not None else 0

    def kv_bytes_used(self) -> int:
        """KV bytes holding the tokens of the requests that ran in the last step (idle slots are waste)."""
        per_token = self.model.config.kv_bytes_per_token(self.model.dtype.itemsize)
        return sum(s.num_cached_tokens for s in self.ran) * per_token


class LLM(FrontEnd):
    engine_class = LLMEngine

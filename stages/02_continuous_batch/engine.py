"""Stage 02: continuous batching (iteration-level scheduling, Orca).

What changes from stage 01: the scheduler. A finished request leaves its slot at once, and
before every step waiting requests take the free slots; a newcomer is prefilled in the same
step as the running requests' decodes. The KV cache still reserves ``max_model_len``
positions per slot, used or not: the waste stage 03 removes.
"""
from __future__ import annotations

import time
from collections import deque

from common.engine import SeqOutput, StepResult, advance
from common.kv_cache import ContiguousKVCache
from common.llm import LLM as FrontEnd
from common.model import Llama
from common.sequence import Sequence, SequenceStatus
from stages import static_batch as static



class Scheduler:
    """Slots are refilled at every step, not when the whole batch is done."""

    def __init__(self, num_slots: int):
        self.waiting: deque[Sequence] = deque()
        self.slots: list[Sequence | None] = [None] * num_slots

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots)

    @property
    def num_running(self) -> int:
        return sum(s is not None for s in self.slots)

    def schedule(self) -> list[int]:
        """Fill the free slots from the queue; return the slots to run this step."""
        now = time.perf_counter()
        # lab 02.1 begin: refill free slots
        for i, seq in enumerate(self.slots):
            if seq is None and self.waiting:
                seq = self.slots[i] = self.waiting.popleft()
                seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, now
        # lab 02.1 end
        return [i for i, s in enumerate(self.slots) if s is not None]

    def postprocess(self, slots: list[int], lens: list[int], outputs: list[SeqOutput]) -> None:
        """Record what the step computed and sampled; a finished request frees its slot for the next step."""
        for i, n, out in zip(slots, lens, outputs):
            advance(self.slots[i], n, out)
            if self.slots[i].is_finished:
                self.slots[i] = None


class LLMEngine(static.LLMEngine):
    """Stage 01's engine with stage 02's scheduler, and one KV buffer for all slots, reserved up front."""
    scheduler_class = Scheduler

    def __init__(self, model: Llama, *, max_model_len: int, max_num_seqs: int):
        super().__init__(model, max_model_len=max_model_len, max_num_seqs=max_num_seqs)
        self.cache = ContiguousKVCache(model.config, max_num_seqs, max_model_len, model.dtype, model.device,
                                       model.batch_invariant)  # a row of max_model_len positions per slot

    def step(self) -> StepResult:
        slots = self.scheduler.schedule()
        return self.run(slots, [self.scheduler.slots[i] for i in slots])

    def release(self) -> None:
        self.scheduler.waiting.clear()
        self.scheduler.slots = [None] * len(self.scheduler.slots)

    @property
    def num_slots(self) -> int:
        return len(self.scheduler.slots)


class LLM(FrontEnd):
    engine_class = LLMEngine

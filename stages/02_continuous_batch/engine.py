"""Stage 02: continuous batching (iteration-level scheduling, Orca).

What changes from stage 01: the scheduler. A finished request leaves its slot at once, and
before every step waiting requests take the free slots; a newcomer is prefilled in the same
step as the running requests' decodes. The KV cache still reserves ``max_model_len``
positions per slot, used or not: the waste stage 03 removes.

The engine is the shared loop (common/engine.py) over this stage's `Scheduler`, one
`ContiguousKVCache` for every slot, reserved up front, and the shared `ModelRunner`.
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
    """Slots are refilled at every step, not when the whole batch is done."""

    def __init__(self, num_slots: int):
        self.waiting: deque[Sequence] = deque()
        self.slots: list[Sequence | None] = [None] * num_slots
        self.ran: list[Sequence] = []  # the requests of the last step

    @property
    def max_num_seqs(self) -> int:
        return len(self.slots)

    def check(self, seq: Sequence) -> None:
        pass  # anything the front end accepts fits a slot of max_model_len positions

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots)

    @property
    def num_running(self) -> int:
        return sum(s is not None for s in self.slots)

    def schedule(self) -> ScheduledBatch:
        """Fill the free slots from the queue; every slot with a request runs this step."""
        now = time.perf_counter()
        # lab 02.1 begin: refill free slots
        for i, seq in enumerate(self.slots):
            if seq is None and self.waiting:
                seq = self.slots[i] = self.waiting.popleft()
                seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, now
        # lab 02.1 end
        slots = [i for i, s in enumerate(self.slots) if s is not None]
        self.ran = seqs = [self.slots[i] for i in slots]
        return ScheduledBatch(seqs, [s.num_new_tokens for s in seqs], [s.num_cached_tokens for s in seqs], slots=slots,
                              admitted=[s.seq_id for s in seqs if s.num_cached_tokens == 0])

    def postprocess(self, batch: ScheduledBatch, outputs: list[SeqOutput]) -> None:
        """Record what the step computed and sampled; a finished request frees its slot for the next step."""
        for i, seq, n, out in zip(batch.slots, batch.seqs, batch.lens, outputs):
            advance(seq, n, out)
            if seq.is_finished:
                self.slots[i] = None

    def release(self) -> None:
        self.waiting.clear()
        self.slots = [None] * len(self.slots)

    def state(self, cache: ContiguousKVCache) -> EngineState:
        """Every slot; KV reserved for all of them, KV used by the requests that ran."""
        used = sum(s.num_cached_tokens for s in self.ran) * cache.bytes_per_token
        return EngineState(len(self.slots), len(self.ran), self.num_running, len(self.waiting), cache.reserved_bytes,
                           used)


def build(config: EngineConfig, tokenizer=None) -> LLMEngine:
    """Stage 02's engine: the shared loop over a continuous scheduler and one buffer of max_model_len per slot."""
    model = config.model.load(Llama)  # common/model.py
    slots = slots_for_budget(config, model)  # as many slots as the KV budget holds, at most max_num_seqs
    cache = ContiguousKVCache(model.config, slots, config.model.max_model_len, model.dtype, model.device,
                              model.batch_invariant)  # common/kv_cache.py, reserved up front
    return LLMEngine(model, Scheduler(slots), cache, ModelRunner(model))


class LLM(FrontEnd):
    build = staticmethod(build)

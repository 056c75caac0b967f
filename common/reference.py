"""The oracle: one request at a time, a plain contiguous KV cache, no scheduling.

Every stage must produce exactly these tokens for every request.
"""
from __future__ import annotations

import time
from collections import deque

from common.engine import EngineState, ScheduledBatch, StepResult, advance
from common.engine_config import EngineConfig
from common.kv_cache import ContiguousKVCache
from common.llm import LLM
from common.model import Llama
from common.runner import ModelRunner
from common.sequence import Sequence, SequenceStatus


class ReferenceEngine:
    """Runs the oldest request alone until it ends, then the next: its own cache, prefill, then one token a step.
    Its own loop, on purpose: the oracle shares the model and the runner with the stages, not their engine."""

    def __init__(self, model: Llama, max_model_len: int, max_num_seqs: int):
        self.model, self.max_model_len = model, max_model_len
        self.max_num_seqs = max_num_seqs  # what it was given; it runs one request at a time whatever this says
        self.runner = ModelRunner(model)
        self.waiting: deque[Sequence] = deque()
        self.current: Sequence | None = None
        self.cache: ContiguousKVCache | None = None

    def check(self, seq: Sequence) -> None:
        pass  # anything the front end accepts fits a cache of its own

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return self.current is not None or bool(self.waiting)

    def step(self) -> StepResult:
        admitted = []
        if self.current is None:  # schedule: the next request, in its own cache
            seq = self.current = self.waiting.popleft()
            admitted = [seq.seq_id]
            seq.status, seq.metrics.first_scheduled_time = SequenceStatus.RUNNING, time.perf_counter()
            max_len = min(len(seq) + seq.params.max_tokens, self.max_model_len)
            self.cache = ContiguousKVCache(self.model.config, 1, max_len, self.model.dtype, self.model.device,
                                           self.model.batch_invariant)
        seq = self.current
        n, start = seq.num_new_tokens, seq.num_cached_tokens  # the whole prompt first, then one token per step
        self.cache.prepare([0], [n], [len(seq)])  # run
        outputs = self.runner.run([seq], [n], self.cache)
        advance(seq, n, outputs[0])  # postprocess
        if seq.is_finished:
            self.current = None
        return StepResult(ScheduledBatch([seq], [n], [start], slots=[0], admitted=admitted), outputs)

    def state(self) -> EngineState:
        return EngineState(1, 1, int(self.current is not None), len(self.waiting), self.kv_bytes_reserved(),
                           self.kv_bytes_used())

    def release(self) -> None:
        self.waiting.clear()
        self.current = self.cache = None

    def kv_bytes_reserved(self) -> int:
        return self.cache.reserved_bytes if self.cache is not None else 0

    def kv_bytes_used(self) -> int:
        seq = self.current
        per_token = self.model.config.kv_bytes_per_token(self.model.dtype.itemsize)
        return (seq.num_cached_tokens if seq is not None else 0) * per_token


def build(config: EngineConfig, tokenizer=None) -> ReferenceEngine:
    return ReferenceEngine(config.model.load(Llama), config.model.max_model_len, config.scheduler.max_num_seqs)


class ReferenceLLM(LLM):
    build = staticmethod(build)

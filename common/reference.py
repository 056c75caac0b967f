"""The oracle: one request at a time, a plain contiguous KV cache, no scheduling.

Every stage must produce exactly these tokens for every request.
"""
from __future__ import annotations

import time

from common.kv_cache import ContiguousKVCache
from common.llm import BaseLLM
from common.runner import ModelRunner
from common.sequence import Sequence, SequenceStatus


class ReferenceLLM(BaseLLM):
    def _run(self, seqs: list[Sequence]) -> None:
        runner = ModelRunner(self.model)
        for seq in seqs:
            self.generate_one(seq, runner)

    def generate_one(self, seq: Sequence, runner: ModelRunner) -> None:
        max_len = min(len(seq) + seq.params.max_tokens, self.max_model_len)
        cache = ContiguousKVCache(self.config, 1, max_len, self.dtype, self.device, self.batch_invariant)
        seq.status = SequenceStatus.RUNNING
        seq.metrics.first_scheduled_time = time.perf_counter()
        while not seq.is_finished:
            new = seq.num_new_tokens  # the whole prompt first, then one token per step
            cache.prepare([0], [new], [len(seq)])
            first = seq.num_cached_tokens == 0
            seq.append_token(runner.run([seq], [new], cache)[0])
            self.stats.steps += 1
            self.stats.prefill_tokens += new if first else 0
            self.stats.decode_tokens += 0 if first else new
            self._advance(1)

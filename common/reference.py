"""The oracle: one request at a time, a plain contiguous KV cache, no scheduling.

Every stage must produce exactly these tokens for every request.
"""
from __future__ import annotations

import time

import torch

from common.kv_cache import ContiguousKVCache
from common.llm import BaseLLM
from common.sampling import sample
from common.sequence import Sequence, SequenceStatus


class ReferenceLLM(BaseLLM):
    def _run(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.generate_one(seq)

    def generate_one(self, seq: Sequence) -> None:
        max_len = min(len(seq) + seq.params.max_tokens, self.max_model_len)
        cache = ContiguousKVCache(self.config, 1, max_len, self.dtype, self.device)
        seq.status = SequenceStatus.RUNNING
        seq.metrics.first_scheduled_time = time.perf_counter()
        cached = 0  # tokens whose keys and values are in the cache
        while not seq.is_finished:
            new = seq.token_ids[cached:]  # the whole prompt first, then one token per step
            cache.prepare([0], [len(new)], [len(seq)])
            ids = torch.tensor(new, device=self.device)
            positions = torch.arange(cached, len(seq), device=self.device)
            hidden = self.model.forward(ids, positions, cache)
            logits = self.model.compute_logits(hidden[-1:])
            seq.append_token(sample(logits[0], seq.params, seq.generator))
            self.stats.steps += 1
            self.stats.prefill_tokens += len(new) if cached == 0 else 0
            self.stats.decode_tokens += len(new) if cached else 0
            cached += len(new)
            self._advance(1)

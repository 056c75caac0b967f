"""ModelRunner: run one flattened step (any mix of prefills and decodes) and sample.

The caller first tells its KV cache what the step holds (``cache.prepare``); the
runner builds the flattened token ids and positions, runs the model, keeps each
sequence's last hidden row and samples one token per sequence.
"""
from __future__ import annotations

import torch

from common.model import AttentionBackend, Llama
from common.sampling import sample_batch
from common.sequence import Sequence


class ModelRunner:
    def __init__(self, model: Llama):
        self.model = model

    def run(self, seqs: list[Sequence], query_lens: list[int], cache: AttentionBackend) -> list[int]:
        """Feed each sequence its last ``query_lens[i]`` tokens; return one sampled token per sequence.

        Afterwards those tokens count as cached (``seq.num_cached_tokens``)."""
        ids, positions = [], []
        for seq, n in zip(seqs, query_lens):
            start = len(seq) - n
            ids.extend(seq.token_ids[start:])
            positions.extend(range(start, len(seq)))
        dev = self.model.device
        hidden = self.model.forward(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), cache)
        last = torch.tensor(query_lens, device=dev).cumsum(0) - 1
        logits = self.model.compute_logits(hidden[last])
        for seq, n in zip(seqs, query_lens):
            seq.num_cached_tokens += n
        return sample_batch(logits, [s.params for s in seqs], [s.generator for s in seqs])

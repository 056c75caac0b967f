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

    def run(self, seqs: list[Sequence], query_lens: list[int], cache: AttentionBackend) -> list[int | None]:
        """Feed each sequence its next ``query_lens[i]`` uncached tokens; sample for those now complete.

        Afterwards those tokens count as cached (``seq.num_cached_tokens``). A sequence whose
        tokens are all cached gets a sampled token; one fed only a chunk of its prompt
        (chunked prefill, stage 03) gets ``None``: its next chunk comes in a later step."""
        ids, positions, last, row = [], [], [], -1
        for seq, n in zip(seqs, query_lens):
            start = seq.num_cached_tokens
            ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            row += n
            if start + n == len(seq):
                last.append(row)
        dev = self.model.device
        hidden = self.model.forward(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), cache)
        done = [seq for seq, n in zip(seqs, query_lens) if seq.num_cached_tokens + n == len(seq)]
        for seq, n in zip(seqs, query_lens):
            seq.num_cached_tokens += n
        if not done:
            return [None] * len(seqs)
        logits = self.model.compute_logits(hidden[torch.tensor(last, device=dev)])
        sampled = iter(sample_batch(logits, [s.params for s in done], [s.generator for s in done]))
        return [next(sampled) if seq.num_cached_tokens == len(seq) else None for seq in seqs]

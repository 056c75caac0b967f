"""ModelRunner: run one flattened step (any mix of prefills and decodes) and sample.

The caller first tells its KV cache what the step holds (``cache.prepare``); the runner
builds the flattened token ids and positions, runs the model, keeps each sequence's last
hidden row and samples one token per sequence whose tokens are then all in the cache. It
changes no sequence (but for handing over a token's log-probabilities, when asked for): the
scheduler's ``postprocess`` records what the step did.
"""
from __future__ import annotations

import torch

from common.model import AttentionBackend, Llama
from common.sampling import process_logits, sample_batch, token_logprobs
from common.sequence import Sequence


class ModelRunner:
    def __init__(self, model: Llama):
        self.model = model

    def run(self, seqs: list[Sequence], query_lens: list[int], cache: AttentionBackend) -> list[int | None]:
        """Feed each sequence its next ``query_lens[i]`` uncached tokens; sample for those that reach their end.

        A sequence fed only a chunk of its prompt (chunked prefill, stage 03) gets ``None``: its
        next chunk comes in a later step."""
        ids, positions, last, done, first_rows = [], [], [], [], []
        for i, (seq, n) in enumerate(zip(seqs, query_lens)):
            start = seq.num_cached_tokens
            first_rows.append(len(ids))
            ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            if start + n == len(seq):
                last.append(len(ids) - 1)
                done.append(i)
        dev = self.model.device
        hidden = self.model.forward(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), cache)
        tokens: list[int | None] = [None] * len(seqs)
        for seq, n, row in zip(seqs, query_lens, first_rows):
            if seq.params.prompt_logprobs is not None:
                self.score_prompt(seq, n, hidden, row)
        if done:
            logits = raw = self.model.compute_logits(hidden[torch.tensor(last, device=dev)])
            if any(seqs[i].params.adjusts_logits for i in done):  # penalties and constraints, row by row
                logits = torch.stack([process_logits(row, s.params, s.prompt_token_ids, s.output_token_ids,
                                                     s.eos_token_id) if s.params.adjusts_logits else row
                                      for row, s in zip(logits, (seqs[i] for i in done))])
            sampled = sample_batch(logits, [seqs[i].params for i in done], [seqs[i].generator for i in done])
            for row, (i, token) in enumerate(zip(done, sampled)):
                tokens[i] = token
                if seqs[i].params.logprobs is not None:  # handed over with the token: append_token records it
                    seqs[i].next_logprobs = token_logprobs(raw[row], token, seqs[i].params.logprobs)
        return tokens

    def score_prompt(self, seq: Sequence, n: int, hidden: torch.Tensor, first_row: int) -> None:
        """vLLM's prompt_logprobs: each prompt token's log-probability given the tokens before it, from the rows
        this step fed (a chunk of the prompt, or all of it); the scheduler shares no cached block with such a
        request, so every row is computed. Recorded once per token, even when a preempted request recomputes."""
        start, end = max(seq.num_cached_tokens, len(seq.prompt_logprobs) - 1), min(seq.num_cached_tokens + n,
                                                                                   seq.num_prompt_tokens - 1)
        if start >= end:
            return
        rows = torch.arange(start, end, device=hidden.device) - seq.num_cached_tokens + first_row
        logits = self.model.compute_logits(hidden[rows])
        for row, p in zip(logits, range(start, end)):
            seq.prompt_logprobs.append(token_logprobs(row, seq.prompt_token_ids[p + 1], seq.params.prompt_logprobs))

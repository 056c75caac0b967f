"""ModelRunner: run one flattened step (any mix of prefills, decodes and draft verifications) and sample.

Once the KV cache knows what the step holds (``cache.prepare``), the runner runs the model and samples each sequence
whose tokens are then all cached (a row, one more per fed draft); it changes none: ``advance`` applies its `SeqOutput`.
"""
from __future__ import annotations

import torch

from common.engine import SeqOutput
from common.model import AttentionBackend, Llama
from common.sampler import greedy_tokens, sample, token_logprobs
from common.sequence import Sequence


class ModelRunner:
    def __init__(self, model: Llama, logprobs_mode: str = "raw_logprobs"):
        """logprobs_mode (vLLM's): "raw_logprobs", the model's, or "processed_logprobs", after the logits processors."""
        self.model, self.logprobs_mode = model, logprobs_mode

    def run(self, seqs: list[Sequence], query_lens: list[int], cache: AttentionBackend) -> list[SeqOutput]:
        """Feed each sequence its next ``query_lens[i]`` tokens (its own, then any drafts); sample for those whose fed
        tokens reach their end (a chunk of a prompt, stage 03's chunked prefill, gets no token)."""
        ids, positions, first_rows, sampled = [], [], [], []  # sampled: (sequence index, its first sampled row)
        outputs = [SeqOutput() for _ in seqs]
        for i, (seq, n) in enumerate(zip(seqs, query_lens)):
            start, end = seq.num_cached_tokens, len(seq) + len(seq.spec_token_ids)
            first_rows.append(len(ids))
            ids.extend(seq.feed_ids(n))
            positions.extend(range(start, start + n))
            if start + n == end:
                outputs[i].drafted = len(seq.spec_token_ids)
                sampled.append((i, len(ids) - 1 - outputs[i].drafted))
            elif seq.spec_token_ids:
                raise ValueError(f"sequence {seq.seq_id}: its draft tokens must be fed in the step that verifies them")
        dev = self.model.device
        hidden = self.model.forward(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), cache)
        for seq, n, row, out in zip(seqs, query_lens, first_rows, outputs):
            if seq.params.prompt_logprobs is not None:
                out.prompt_logprobs = self.score_prompt(seq, n, hidden, row)
        if sampled:
            rows = [r + j for i, r in sampled for j in range(outputs[i].drafted + 1)]
            logits = self.model.compute_logits(hidden[torch.tensor(rows, device=dev)])
            done = self.process_rows(seqs, sampled, outputs, logits)
            plain = [(i in done or not seqs[i].processors) and seqs[i].params.greedy for i, _ in sampled]
            argmax = greedy_tokens(logits) if any(plain) else None  # one vectorized argmax for the plain greedy rows
            at = 0
            for (i, _), fast in zip(sampled, plain):
                k = outputs[i].drafted + 1
                self.sample_run(seqs[i], logits[at:at + k], argmax[at:at + k] if fast else None, outputs[i], i in done)
                at += k
        return outputs

    def process_rows(self, seqs: list[Sequence], sampled: list[tuple[int, int]], outputs: list[SeqOutput],
                     logits: torch.Tensor) -> set[int]:
        """A later stage's hook (stage 07's masks.py): process some sequences' rows of ``logits`` in place, at once;
        returns their indices (their processors are then not applied row by row)."""
        return set()

    def sample_run(self, seq: Sequence, logits: torch.Tensor, argmax: list[int] | None, out: SeqOutput,
                   done: bool = False) -> None:
        """Sample ``seq``'s rows in position order; row i assumes the first i drafts kept, so its processors see that
        history (a grammar looks ahead along it and comes back). The run stops after the first token that differs
        from the draft fed after it: the rows beyond assumed a token not chosen (exact-match verification: the kept
        tokens are one-at-a-time decoding's). ``done``: its rows were processed by ``process_rows``."""
        drafts, p = seq.spec_token_ids[:out.drafted], seq.params
        for i, row in enumerate(logits):
            processed = row if done else seq.processed(row, out.tokens)
            token = argmax[i] if argmax is not None else sample(processed, p, seq.generator)
            out.tokens.append(token)
            if p.logprobs is not None:
                source = processed if self.logprobs_mode == "processed_logprobs" else row
                out.logprobs = (out.logprobs or []) + [token_logprobs(source, token, p.logprobs)]
            if i == len(drafts) or token != drafts[i]:
                break

    def score_prompt(self, seq: Sequence, n: int, hidden: torch.Tensor, first_row: int) -> list:
        """vLLM's prompt_logprobs: each prompt token's log-probability given those before it, from the rows this step
        fed (such a request shares no cached block, so every row is computed); once per token, even when recomputed."""
        start, end = max(seq.num_cached_tokens, len(seq.prompt_logprobs) - 1), min(seq.num_cached_tokens + n,
                                                                                   seq.num_prompt_tokens - 1)
        if start >= end:
            return []
        rows = torch.arange(start, end, device=hidden.device) - seq.num_cached_tokens + first_row
        logits = self.model.compute_logits(hidden[rows])
        return [token_logprobs(row, seq.prompt_token_ids[p + 1], seq.params.prompt_logprobs)
                for row, p in zip(logits, range(start, end))]

"""A step's masks off the critical path: filled in one call per backend, applied to all constrained rows at once.

Row by row (constraint.py), each request's mask costs a Python call, a fill and a row copy per step: a real share of
the step at 64 requests (vLLM batched its fills for +15%, vllm#51331). `BatchMasks.fill` fills many masks into one
array (xgrammar's `BatchGrammarMatcher`, the automaton's kept masks, llguidance's one by one on the engine's thread:
its `LLExecutor` hands them to a worker thread, which on two cores waits for a core torch's threads hold: slower,
docs/structured.md); `apply_masks` masks every constrained row at once. Each mask is the per-row path's (the same
matcher state): the tokens do not change.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

from common.runner import ModelRunner

from .backend_xgrammar import XGrammarMatcher
from .constraint import BYTE_BIAS, GrammarConstraint
from .schema.checked import CheckedMatcher

ROWS_AT_ONCE = 8  # rows whose biases are looked up at once: 8 rows of a 49,152-token vocabulary are 1.5 MB


def only_constraint(seq) -> GrammarConstraint | None:
    """The request's grammar when it is its only rule (else its grammar must come last in its chain: per row)."""
    rules = seq.processors
    return rules[0] if len(rules) == 1 and isinstance(rules[0], GrammarConstraint) else None


class BatchMasks:
    def __init__(self, vocab_size: int):
        self.words, self.xgrammar = -(-vocab_size // 32), None  # xgrammar's batch matcher on first use
        self.seconds = 0.0  # the fills' time (the stage's measurement)

    def fill(self, rules: list[GrammarConstraint]) -> None:
        start = time.perf_counter()
        todo = [(r, m.m if isinstance(m, CheckedMatcher) else m) for r in rules if (m := r.pending()) is not None]
        if xg := [(rule, m.m) for rule, m in todo if isinstance(m, XGrammarMatcher)]:
            import xgrammar as xgr
            out = np.zeros((len(xg), self.words), dtype=np.int32)
            self.xgrammar = self.xgrammar or xgr.BatchGrammarMatcher(max_threads=1)
            self.xgrammar.batch_fill_next_token_bitmask([m for _, m in xg], torch.from_numpy(out))
            for (rule, _), mask in zip(xg, out):
                rule.put(mask)
        for rule, m in todo:  # llguidance's on this thread (see above); the automaton's: its mask kept per state
            if not isinstance(m, XGrammarMatcher):
                rule.put(m.fill())
        self.seconds += time.perf_counter() - start


def apply_masks(logits: torch.Tensor, rows: list[int], masks: list[np.ndarray]) -> None:
    """-inf, in place, wherever a listed row's mask has a 0 bit. On the CPU, constraint.py's byte-to-biases lookup,
    a few rows at a time into one buffer that stays in cache (the whole step's biases at once, tens of MB, went
    through main memory: 2x slower at 192 rows); xgrammar's CPU kernel is slower still (docs/structured.md). On
    CUDA, xgrammar's kernel."""
    words = np.stack(masks)
    if logits.device.type != "cpu":
        from xgrammar import apply_token_bitmask_inplace
        bitmask = torch.zeros((logits.shape[0], words.shape[1]), dtype=torch.int32)
        bitmask[rows] = torch.from_numpy(words)
        return apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=logits.shape[1],
                                           indices=rows)
    out, width = logits.numpy(), logits.shape[1]
    bias = np.empty((ROWS_AT_ONCE, words.shape[1] * 32), dtype=np.float32)  # reused: it stays in the core's cache
    for first in range(0, len(rows), ROWS_AT_ONCE):
        part = words[first:first + ROWS_AT_ONCE].view(np.uint8)
        # mode="clip": numpy buffers a take with out= and the default mode="raise" (a byte is always a valid index)
        np.take(BYTE_BIAS, part, axis=0, mode="clip", out=bias[:len(part)].reshape(len(part), -1, 8))
        for row, row_bias in zip(rows[first:first + ROWS_AT_ONCE], bias):
            np.add(out[row], row_bias[:width], out=out[row])


class StructuredRunner(ModelRunner):
    """The runner with a step's constrained rows masked together, and each piece's time (bench.pieces)."""

    def __init__(self, model, masks: BatchMasks):
        super().__init__(model, logprobs_mode="processed_logprobs")  # the masked distribution
        self.masks, self.marks, self.steps, self.mask_steps, self.filled_at = masks, [], 0, 0, 0.0
        self.costs = {"forward": 0.0, "apply": 0.0, "sampler": 0.0}  # seconds over all steps
        self.mask_us: deque[float] = deque(maxlen=4096)  # the last steps' mask time per constrained row, µs

    def run(self, seqs, query_lens, cache):
        self.marks = [time.perf_counter()]
        outputs = super().run(seqs, query_lens, cache)
        end, (start, *sampled) = time.perf_counter(), self.marks  # sampled: process_rows' start and end
        self.costs["forward"] += (sampled[0] if sampled else end) - start
        self.costs["sampler"] += end - sampled[-1] if sampled else 0.0
        self.steps += 1
        return outputs

    def process_rows(self, seqs, sampled, outputs, logits) -> set[int]:
        start = time.perf_counter()
        mine = {i: rule for i, _ in sampled if (rule := only_constraint(seqs[i])) is not None}
        self.masks.fill(list(mine.values()))  # those the forced look-ahead did not fill (forced.py)
        filled, rows, masks, at = time.perf_counter(), [], [], 0
        for i, _ in sampled:
            k = outputs[i].drafted + 1
            if i in mine:  # row j assumes the first j drafts kept: the mask after them (kept from the look-ahead)
                masks += [mine[i].mask_after(seqs[i].spec_token_ids[:j]) for j in range(k)]
                rows += range(at, at + k)
            at += k
        if rows:
            apply_masks(logits, rows, masks)
            self.mask_us.append(1e6 * (self.masks.seconds - self.filled_at + time.perf_counter() - filled) / len(rows))
            self.mask_steps += 1
        self.filled_at, end = self.masks.seconds, time.perf_counter()
        self.costs["apply"] += end - filled
        self.marks += [start, end]
        return set(mine)

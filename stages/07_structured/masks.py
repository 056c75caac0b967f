"""A step's masks off the critical path: filled in one call per backend, applied in one native call.

The per-row path (constraint.py) asks each request's matcher for its mask and adds it to the request's own row, a
Python call and a copy of the row per request: at 64 requests in flight, 64 fills and 64 applies between the
forward and the next step, while nothing else runs. vLLM batches both (vllm#51331: batched bitmask fills, +15%).
Here `BatchMasks.fill` fills the masks of many requests at their current positions together, into one
[requests, words] array: xgrammar's rows with its `BatchGrammarMatcher`, llguidance's with its `LLExecutor` (both
native, without the interpreter lock), the hand-written automaton's from its masks cached per state (a lookup).
`StructuredRunner` then applies the masks of every constrained row of a step at once (`apply_masks`: one table lookup
for all of them, one add per request) and samples those rows without the per-row processor chain: greedy rows join
the batch's one vectorized argmax.

Each mask is the one the per-row path computes (the same matcher state), kept in the request's
`GrammarConstraint`, so the tokens do not change. A request with other rules beside its grammar (min_tokens,
allowed_token_ids, ...) keeps the per-row path: its grammar must come last in its chain.

``overlap=True`` (``overlap_masks``) computes the masks of the step's rows on a worker thread while the forward runs
(torch and both grammar libraries release the interpreter lock); the tokens are the same. On two cores the forward
already uses both, so the worker takes a core from it: it is off by default (docs/structured.md).
"""
from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import torch

from common.runner import ModelRunner

from .backend_guidance import GuidanceMatcher
from .backend_xgrammar import XGrammarMatcher
from .constraint import BYTE_BIAS, GrammarConstraint
from .schema.checked import CheckedMatcher


def backend_matcher(matcher):
    """The backend's matcher under a check of the finished output (schema/checked.py), which fills as it does."""
    return backend_matcher(matcher.m) if isinstance(matcher, CheckedMatcher) else matcher


def only_constraint(seq) -> GrammarConstraint | None:
    """The request's grammar when it is its only rule (its rows can then be masked with the batch's)."""
    rules = seq.processors
    return rules[0] if len(rules) == 1 and isinstance(rules[0], GrammarConstraint) else None


class BatchMasks:
    """Fills many requests' masks at their current positions in one call per backend; keeps what it cost."""

    def __init__(self, vocab_size: int, threads: int = 1):
        self.words, self.threads = -(-vocab_size // 32), threads
        self.xgrammar = self.executor = None  # made on first use: a stage may run without either library
        self.seconds, self.filled = 0.0, 0  # the fills' time and masks filled (the stage's measurement)

    def fill(self, rules: list[GrammarConstraint]) -> None:
        start = time.perf_counter()
        todo = [(rule, backend_matcher(m)) for rule in rules if (m := rule.pending()) is not None]
        if todo:
            out = np.zeros((len(todo), self.words), dtype=np.int32)
            xg = [(i, m.m) for i, (_, m) in enumerate(todo) if isinstance(m, XGrammarMatcher)]
            gd = [(m.m, i) for i, (_, m) in enumerate(todo) if isinstance(m, GuidanceMatcher)]
            if xg:
                if self.xgrammar is None:
                    import xgrammar as xgr
                    self.xgrammar = xgr.BatchGrammarMatcher(max_threads=self.threads)
                self.xgrammar.batch_fill_next_token_bitmask([m for _, m in xg], torch.from_numpy(out),
                                                            [i for i, _ in xg])
            if gd:
                if self.executor is None:
                    import llguidance as llg
                    self.executor = llg.LLExecutor(num_threads=self.threads)
                self.executor.unsafe_compute_mask_ptr(gd, out.ctypes.data, self.words * 4, len(todo))
            for i, (rule, m) in enumerate(todo):
                # the automaton (fsm.py) keeps a mask per state: its fill is a lookup, shared, never copied
                rule.put(out[i] if isinstance(m, (XGrammarMatcher, GuidanceMatcher)) else m.fill())
            self.filled += len(todo)
        self.seconds += time.perf_counter() - start


def apply_masks(logits: torch.Tensor, rows: list[int], masks: list[np.ndarray]) -> None:
    """-inf, in place, wherever a listed row's mask has a 0 bit (``rows`` ascending). On the CPU, constraint.py's
    byte-to-biases lookup done once for all the rows, then one add per run of consecutive rows (a request's rows are
    one run); xgrammar's own CPU kernel took several times longer (docs/structured.md). On CUDA, xgrammar's kernel."""
    if not rows:
        return
    words = np.stack(masks)
    if logits.device.type == "cpu":
        bias = np.take(BYTE_BIAS, words.view(np.uint8), axis=0).reshape(len(rows), -1)[:, :logits.shape[1]]
        out, first = logits.numpy(), 0
        for j in range(1, len(rows) + 1):
            if j == len(rows) or rows[j] != rows[j - 1] + 1:  # the end of a run of consecutive rows
                a, b = rows[first], rows[j - 1] + 1
                np.add(out[a:b], bias[first:j], out=out[a:b])
                first = j
        return
    from xgrammar import apply_token_bitmask_inplace
    bitmask = torch.zeros((logits.shape[0], words.shape[1]), dtype=torch.int32)
    bitmask[rows] = torch.from_numpy(words)
    apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=logits.shape[1], indices=rows)


class StructuredRunner(ModelRunner):
    """The runner with a step's constrained rows masked together (``process_rows``), and each piece's time."""

    def __init__(self, model, masks: BatchMasks, overlap: bool = False):
        super().__init__(model, logprobs_mode="processed_logprobs")  # the masked distribution
        self.masks, self.overlap, self.worker, self.marks, self.filled_at = masks, overlap, None, [], 0.0
        self.costs = {"forward": 0.0, "apply": 0.0, "sampler": 0.0}  # seconds, summed over steps (fill: masks's)
        # the last steps with constrained rows: their masks' time (fill + apply) per constrained row, µs; how many
        self.mask_us, self.mask_steps, self.steps = deque(maxlen=4096), 0, 0

    def run(self, seqs, query_lens, cache):
        self.marks = [time.perf_counter()]
        if self.overlap:  # the masks of the rows this step samples, computed while the forward runs
            rows = [(r, s.spec_token_ids) for s, n in zip(seqs, query_lens)
                    if s.num_cached_tokens + n == len(s) + len(s.spec_token_ids)
                    and (r := only_constraint(s)) is not None]
            self.worker = threading.Thread(target=self.fill_rows, args=(rows,), daemon=True)
            self.worker.start()
        outputs = super().run(seqs, query_lens, cache)
        if self.worker is not None:
            self.worker.join()
            self.worker = None
        end, marks = time.perf_counter(), self.marks
        self.costs["forward"] += (marks[1] if len(marks) > 1 else end) - marks[0]
        if len(marks) > 1:
            self.costs["sampler"] += end - marks[-1]
        self.steps += 1
        return outputs

    def fill_rows(self, rows: list[tuple[GrammarConstraint, list[int]]]) -> None:
        """Each request's masks at its position (one batched fill), then along its drafts (kept in its constraint)."""
        self.masks.fill([rule for rule, _ in rows])
        for rule, drafts in rows:
            for j in range(1, len(drafts) + 1):
                rule.mask_after(drafts[:j])

    def process_rows(self, seqs, sampled, outputs, logits) -> set[int]:
        start = time.perf_counter()
        self.marks.append(start)
        if self.worker is not None:
            self.worker.join()
            self.worker = None
        mine = {i: rule for i, _ in sampled if (rule := only_constraint(seqs[i])) is not None}
        self.masks.fill(list(mine.values()))  # those the look-ahead or the worker did not fill already
        filled, rows, masks, at = time.perf_counter(), [], [], 0
        for i, _ in sampled:
            k = outputs[i].drafted + 1
            if i in mine:  # row j assumes the first j drafts kept: the mask after them (kept from the look-ahead)
                drafts = seqs[i].spec_token_ids
                masks += [mine[i].mask_after(drafts[:j]) for j in range(k)]
                rows += range(at, at + k)
            at += k
        apply_masks(logits, rows, masks)
        end = time.perf_counter()
        self.costs["apply"] += end - filled  # the rows' masks looked up, then applied
        if rows:  # this step's fills (in the look-ahead, on the worker, here) and the apply, per constrained row
            self.mask_us.append(1e6 * (self.masks.seconds - self.filled_at + end - filled) / len(rows))
            self.mask_steps += 1
        self.filled_at = self.masks.seconds
        self.marks.append(end)
        return set(mine)

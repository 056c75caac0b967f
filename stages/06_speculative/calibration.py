"""The adaptive policy's first measurements (cost_model.py's `StepCost`), taken when the stage's `LLM` starts.

For 1, 2, 4, ... requests, a few decoding steps, each feeding every request's own token with no drafts, half of
``k`` and all ``k`` (random tokens: each is verified, and missed, as a wrong guess is). They are verify steps as a
real request's are: every fed row runs the layers AND the LM head and is checked, where a prefill step of as many
rows would compute logits for its last rows only. An earlier version timed prefills: the LM head of the draft rows
(a sixth of a 135M model's step at 64 rows) went unmeasured, the fit took those fastest times, and the policy fed
drafts at 16-64 in flight where they lost. The requests run on the engine directly (no observer, no server metric
sees them). Then a few passes of a draft model, where one drafts (draft_model.py), so the policy knows what
rows and drafts cost on this machine before the first request; every later step refines the fits.
"""
from __future__ import annotations

import random
import time

from .proposer import Proposer

PROMPT_TOKENS = 16  # a short context: what is measured is the rows, not the attention over a long one


class RandomDrafts(Proposer):
    """``k`` random tokens for each request asked: calibration's drafts (a real proposer's would match the prompt's
    repeats; random ones miss, so each step keeps one token per request and the next step is alike)."""

    def __init__(self, vocab_size: int, seed: int = 0):
        super().__init__(0)
        self.vocab_size, self.rng = vocab_size, random.Random(seed)

    def draft(self, k: int) -> None:
        """Give each request ``k`` drafts from the next step on."""
        self.k = k

    def propose(self, seqs, ks):
        return [[self.rng.randrange(3, self.vocab_size) for _ in range(k)] for k in ks]


def calibration_prompts(batch: int, vocab_size: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of random tokens (so no prefix cache hit shortens a step)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]


def calibration_batches(max_num_seqs: int, k: int, max_rows: int) -> list[tuple[int, list[int]]]:
    """(requests, drafts per request for each measured step): for 1, 2, 4, ... requests, no drafts, k // 2 and
    k, as far as a step's budget allows."""
    points, batch = [], 1
    while batch <= max_num_seqs:
        drafts = [d for d in (0, k // 2, k) if batch * (1 + d) <= max_rows]
        if drafts:
            points.append((batch, drafts))
        batch *= 2
    return points


def calibrate(llm) -> None:
    """Seed the policy of ``llm``'s scheduler (stage 06's) with the start-up steps; nothing when the policy is off."""
    engine = llm.engine
    sched, bm, policy = engine.scheduler, engine.scheduler.block_manager, engine.scheduler.policy
    if policy is None:
        return
    k = llm.engine_config.speculative.num_speculative_tokens
    max_tokens = 2 + 4 * (k + 1)  # room for every measured step's drafts (a run of random ones keeps 1 a step)
    per_seq = -(-(PROMPT_TOKENS + max_tokens) // bm.block_size)  # blocks a request holds at most
    most_seqs = min(sched.max_num_seqs, 64, max(1, (bm.num_free_blocks - 1) // per_seq))
    batches = calibration_batches(most_seqs, k, sched.max_num_batched_tokens)
    proposer = RandomDrafts(llm.config.vocab_size)
    with sched.drafting_with(proposer):
        for i, (batch, drafts) in enumerate(batches[-1:] + batches):  # the first pays one-time costs, unmeasured
            measure(engine, llm, batch, drafts if i > 0 else drafts[-1:], proposer, policy if i > 0 else None, seed=i)
    for each in sched.proposers:  # what a draft model's pass costs here (draft_model.py)
        each.calibrate()


def measure(engine, llm, batch: int, drafts: list[int], proposer: RandomDrafts, policy, seed: int) -> None:
    """Prefill ``batch`` requests (unmeasured), then one decoding step per entry of ``drafts``, timed and observed
    (unless ``policy`` is None: a warm-up) when every request fed its token and its drafts."""
    k = llm.engine_config.speculative.num_speculative_tokens
    params = {"temperature": 0, "max_tokens": 2 + 4 * (k + 1), "ignore_eos": True}
    try:
        for seq in [s for p in calibration_prompts(batch, llm.config.vocab_size, seed) for s in
                    llm.make_samples(p, params)]:
            engine.add(seq)
        proposer.draft(0)
        sched = engine.scheduler
        while sched.waiting or any(s.num_new_tokens != 1 for s in sched.running):
            engine.step()  # the prompts, in as many steps as the budget takes
        for d in drafts:
            proposer.draft(d)
            start = time.perf_counter()
            result = engine.step()
            seconds = time.perf_counter() - start
            if policy is not None and len(result.batch.seqs) == batch and sum(result.batch.lens) == batch * (1 + d):
                policy.cost.observe(batch, batch * (1 + d), seconds)
    finally:
        engine.release()

"""The adaptive policy's first measurements (cost_model.py's `StepCost`), taken when the stage's `LLM` starts.

A few steps of 1, 2, 4, ... requests, each feeding its rows alone and with drafts (prompts of random tokens, one
step each, run on the engine directly: no observer, no server metric sees them), and a few passes of a draft
model, so the policy knows what rows and drafts cost on this machine before the first request. Every later step
refines them.
"""
from __future__ import annotations

import random
import time


def calibration_prompts(batch: int, rows: int, vocab_size: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``rows`` tokens in all, random tokens (so no prefix cache hit shortens the step)."""
    rng = random.Random(seed)
    each = [rows // batch + (i < rows % batch) for i in range(batch)]
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in each]


def calibration_points(max_num_seqs: int, k: int, max_rows: int) -> list[tuple[int, int]]:
    """(requests, rows) of the start-up steps: for 1, 2, 4, ... requests, their rows alone and with k drafts
    each (and halfway), as far as a step's budget allows."""
    points, batch = [], 1
    while batch <= max_num_seqs:
        for rows in (batch, batch + batch * k // 2, batch * (k + 1)):
            if rows <= max_rows:
                points.append((batch, rows))
        batch *= 2
    return points


def calibrate(llm) -> None:
    """Seed the policy of ``llm``'s scheduler (stage 06's) with the start-up steps; nothing when the policy is off."""
    engine = llm.engine
    sched, bm, policy = engine.scheduler, engine.scheduler.block_manager, engine.scheduler.policy
    if policy is None:
        return
    most = min(sched.max_num_batched_tokens, (bm.num_free_blocks - sched.max_num_seqs - 1) * bm.block_size)
    k = llm.engine_config.speculative.num_speculative_tokens
    points = calibration_points(min(sched.max_num_seqs, 64), k, most)
    for i, (batch, rows) in enumerate(points[-1:] + points):  # the first pays one-time costs, unmeasured
        prompts = calibration_prompts(batch, rows, llm.config.vocab_size, seed=i)
        try:
            for seq in [s for p in prompts for s in llm.make_samples(p, {"temperature": 0, "max_tokens": 1})]:
                engine.add(seq)
            start = time.perf_counter()
            engine.step()
            seconds = time.perf_counter() - start
            if i > 0 and not engine.has_work():  # one step took them all
                policy.cost.observe(batch, rows, seconds)
            while engine.has_work():
                engine.step()
        finally:
            engine.release()
    for proposer in sched.proposers:  # what a draft model's pass costs here (draft_model.py)
        proposer.calibrate()

"""The adaptive policy's first measurements (cost_model.py's `StepCost`), taken when the stage's `LLM` starts.

For 1, 2, 4, ... requests, decoding steps feeding each request's token and no drafts, k // 2 or k random ones, thrice
(each missed, as a wrong guess is): verify steps, whose every row runs the LM head too (timed prefills left it out:
drafts were fed where they lost). The requests run on the engine directly (no observer sees them); a draft model
then times a few passes (draft_model.py). Every later step refines the fits."""
from __future__ import annotations

import random
import time

from .proposer import Proposer

PROMPT_TOKENS = 16  # a short context: what is measured is the rows, not the attention over a long one


class RandomDrafts(Proposer):
    """``k`` random drafts per request: each missed, so every step keeps one token per request, like the next."""

    def __init__(self, vocab_size: int, seed: int = 0):
        super().__init__(0)
        self.vocab_size, self.rng = vocab_size, random.Random(seed)

    def draft(self, k: int) -> None:  # each request gets ``k`` drafts from the next step on
        self.k = k

    def propose(self, seqs, ks):
        return [[self.rng.randrange(3, self.vocab_size) for _ in range(k)] for k in ks]


def calibrate(llm) -> None:
    """Seed the policy of ``llm``'s scheduler (stage 06's) with the start-up steps; nothing when the policy is off."""
    sched, bm, policy = llm.engine.scheduler, llm.engine.scheduler.block_manager, llm.engine.scheduler.policy
    if policy is None:
        return
    k = llm.engine_config.speculative.max_drafts  # the longest draft a request may feed
    max_tokens = 2 + 4 * (k + 1)  # room for every measured step's drafts (a run of random ones keeps 1 a step)
    per_seq = -(-(PROMPT_TOKENS + max_tokens) // bm.block_size)  # blocks a request holds at most
    most_seqs = min(sched.max_num_seqs, 64, max(1, (bm.num_free_blocks - 1) // per_seq))
    batches = [(b, ds) for b in (2 ** i for i in range(most_seqs.bit_length()))  # 1, 2, 4, ... requests
               if (ds := [d for d in (0, k // 2, k) if b * (1 + d) <= sched.max_num_batched_tokens])]  # drafts, if room
    proposer, params = RandomDrafts(llm.config.vocab_size), dict(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with sched.drafting_with(proposer):
        for i, (batch, drafts) in enumerate(batches[-1:] + batches):  # the first pays one-time costs, unmeasured
            measure(llm, batch, drafts if i > 0 else drafts[-1:], proposer, policy if i > 0 else None, i, params)
    for each in sched.proposers:  # what a draft model's pass costs here (draft_model.py)
        each.calibrate()


def measure(llm, batch: int, drafts: list[int], proposer: RandomDrafts, policy, seed: int, params: dict) -> None:
    """Prefill ``batch`` requests of random tokens (no prefix cache hit), then time one decoding step per entry of
    ``drafts``, observed (unless ``policy`` is None: a warm-up) when every request fed its token and drafts."""
    engine, sched, rng, vocab = llm.engine, llm.engine.scheduler, random.Random(seed), llm.config.vocab_size
    try:
        for _ in range(batch):
            for seq in llm.make_samples([rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)], params):
                engine.add(seq)
        proposer.draft(0)
        while sched.waiting or any(s.num_new_tokens != 1 for s in sched.running):
            engine.step()  # the prompts, in as many steps as the budget takes
        for d in drafts * 3:  # each thrice, interleaved: the fit keeps each row count's fastest (load only adds)
            proposer.draft(d)
            start = time.perf_counter()
            result, seconds = engine.step(), time.perf_counter() - start  # (the step runs first)
            if policy is not None and len(result.batch.seqs) == batch and sum(result.batch.lens) == batch * (1 + d):
                policy.cost.observe(batch, batch * (1 + d), seconds)
    finally:
        engine.release()

"""Scheduling drafts: before stage 03's schedule, each decoding request gets the draft tokens its step can take.

A draft is fed whole in the step that verifies it (the runner's rule), after the request's own token, so each
decoding request's drafts are capped before anything is allocated (`draft_caps`): by ``num_speculative_tokens``,
by what the request can still produce (``max_tokens``, ``max_model_len``: a draft past its end is wasted), by the
step's token budget left when its turn comes (running requests go oldest first, as stage 03 schedules them), and
by the KV blocks free without preempting anyone: a guess is never worth evicting another request. Then the
proposers guess, and stage 03's `Scheduler.schedule` runs unchanged.
"""
from __future__ import annotations

import time

from common.sequence import Sequence
from stages import streaming


class Scheduler(streaming.engine.Scheduler):
    proposer = None  # the method's proposer (set by the engine; None: speculation off)
    predictions = None  # `PredictionProposer`, for requests that carry a predicted output
    num_speculative_tokens = 0
    disable_by_batch_size = None  # no drafts while more requests than this run
    propose_seconds = 0.0  # time the last step spent proposing (the proposer's share of the step)

    def schedule(self) -> tuple[list[Sequence], list[int]]:
        start = time.perf_counter()
        for seq in self.running:
            seq.spec_token_ids = []
        if self.proposer is not None and len(self.running) <= (self.disable_by_batch_size or len(self.running)):
            self.propose_drafts()
        self.propose_seconds = time.perf_counter() - start
        return super().schedule()

    def propose_drafts(self) -> None:
        """Every decoding request with room for drafts gets them: from its prediction if it has one, else from the
        method's proposer; a proposer may give fewer than asked (or none)."""
        caps = self.draft_caps()
        wanted = [s for s in self.running if caps.get(s.seq_id, 0) > 0]
        predicted = [s for s in wanted if s.params.prediction is not None]
        others = [s for s in wanted if s.params.prediction is None]
        for proposer, seqs in ((self.predictions, predicted), (self.proposer, others)):
            if seqs:
                for seq, draft in zip(seqs, proposer.propose(seqs, [caps[s.seq_id] for s in seqs])):
                    seq.spec_token_ids = list(draft[:caps[seq.seq_id]])

    def draft_caps(self) -> dict[int, int]:
        """seq_id -> the most draft tokens each decoding request may take this step (0: none)."""
        bm, caps = self.block_manager, {}
        # lab 06.2 begin: cap the drafts
        budget, free = self.max_num_batched_tokens, bm.num_free_blocks
        for seq in self.running:  # in the order stage 03 schedules them
            own = self.chunk(seq, seq.num_new_tokens, budget)  # a prompt chunk, or a decode's one token
            if own == 0:
                break
            k = 0
            if seq.num_new_tokens == 1:
                can_produce = min(seq.params.max_tokens - len(seq.output_token_ids), seq.max_len - len(seq))
                k = max(0, min(self.num_speculative_tokens, budget - 1, can_produce - 1))
                while k > 0 and bm.blocks_needed(seq, 1 + k) > free:
                    k -= 1
                caps[seq.seq_id] = k
            free -= bm.blocks_needed(seq, own + k)
            budget -= own + k
        # lab 06.2 end
        return caps

"""Scheduling drafts: before stage 03's schedule, each decoding request gets the draft tokens its step can take.

A draft is fed whole in the step that verifies it (the runner's rule), after the request's own token, so each
decoding request's drafts are capped before anything is allocated (`draft_caps`): by ``num_speculative_tokens``
(`draft_limit`), by what the request can still produce (``max_tokens``, ``max_model_len``: a draft past its end is
wasted), by the step's token budget left when its turn comes (running requests go oldest first, as stage 03
schedules them), and by the KV blocks free without preempting anyone: a guess is never worth evicting another
request. Then the proposers guess (`proposer_for` says whose turn it is), and stage 03's `Scheduler.schedule` runs
unchanged. Stage 07 adds one proposer through those two hooks: the tokens a grammar forces.
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
        self.propose_drafts()
        self.propose_seconds = time.perf_counter() - start
        return super().schedule()

    def draft_limit(self, seq: Sequence) -> int:
        """The most drafts ``seq`` may ask for this step, before the step's caps: ``num_speculative_tokens`` while
        speculation is on and the batch is no larger than ``disable_by_batch_size``, else 0."""
        if self.proposer is None or len(self.running) > (self.disable_by_batch_size or len(self.running)):
            return 0
        return self.num_speculative_tokens

    def proposer_for(self, seq: Sequence):
        """Who guesses for ``seq``: its predicted output if it has one, else the method's proposer."""
        return self.predictions if seq.params.prediction is not None else self.proposer

    def propose_drafts(self) -> None:
        """Every decoding request with room for drafts gets them from its proposer, one batched call per proposer;
        a proposer may give fewer than asked (or none)."""
        caps = self.draft_caps()
        groups: dict[int, tuple[object, list[Sequence]]] = {}
        for seq in self.running:
            if caps.get(seq.seq_id, 0) > 0:
                proposer = self.proposer_for(seq)
                groups.setdefault(id(proposer), (proposer, []))[1].append(seq)
        for proposer, seqs in groups.values():
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
                k = max(0, min(self.draft_limit(seq), budget - 1, can_produce - 1))
                while k > 0 and bm.blocks_needed(seq, 1 + k) > free:
                    k -= 1
                caps[seq.seq_id] = k
            free -= bm.blocks_needed(seq, own + k)
            budget -= own + k
        # lab 06.2 end
        return caps

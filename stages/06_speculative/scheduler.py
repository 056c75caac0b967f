"""Scheduling drafts: before stage 03's schedule, each decoding request gets the draft tokens its step can take.

A draft is fed whole in the step that verifies it, after the request's own token, so `draft_caps` first caps each
decoding request's drafts: by its proposer's limit, by what the request can still produce, by the step's token
budget left at its turn (oldest first, as stage 03 schedules), and by the KV blocks free without preempting anyone (a
guess is never worth evicting a request). The proposers (in priority order: the first whose ``limit`` is not None
drafts; stage 07 puts the grammar's forced tokens first) then guess, and a policy (cost_model.py, the default) keeps
the drafts worth their rows, learning from every step. Then stage 03's plan runs unchanged.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from common.engine import ScheduledBatch
from common.engine_config import SchedulerConfig
from common.sequence import Sequence
from stages.paged_kv import BlockManager, Scheduler  # stage 03: block_manager.py, scheduler.py

from .cost_model import AdaptiveDrafts
from .proposer import Proposer


class SpeculativeScheduler(Scheduler):
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, proposers: list[Proposer],
                 policy: AdaptiveDrafts | None = None):
        super().__init__(config, block_manager)
        self.proposers = proposers  # in priority order; none: nothing is drafted (stage 05's engine)
        self.policy = policy  # None: every proposal is fed whole
        self.scheduled_at = 0.0

    def schedule(self) -> ScheduledBatch:
        start = time.perf_counter()
        for seq in self.running:
            seq.spec_token_ids, seq.spec_from_prediction = [], False
        self.propose_drafts()
        propose_seconds = time.perf_counter() - start
        batch = super().schedule()
        batch.propose_seconds = propose_seconds  # the proposers' share of the step, for its event
        self.scheduled_at = time.perf_counter()
        return batch

    def postprocess(self, batch: ScheduledBatch, outputs) -> None:
        """Stage 03's, and the policy learns: the step's time against its rows, what each proposal would have kept."""
        if self.policy is not None:
            rows, drafted = sum(batch.lens), sum(len(s.spec_token_ids) for s in batch.seqs)
            self.policy.cost.observe(rows - drafted, rows, time.perf_counter() - self.scheduled_at)
        super().postprocess(batch, outputs)
        if self.policy is not None:
            self.policy.score()
            self.policy.forget(s.seq_id for s in batch.seqs if s.is_finished)

    @contextmanager
    def drafting_with(self, proposer: Proposer):
        """Steps drafting with ``proposer`` alone, every draft fed (calibration.py's start-up steps)."""
        saved, self.proposers, self.policy = (self.proposers, self.policy), [proposer], None
        try:
            yield
        finally:
            self.proposers, self.policy = saved

    def proposer_for(self, seq: Sequence) -> tuple[Proposer | None, int]:
        """Who guesses for ``seq`` this step, and the most drafts it may give (before the step's caps)."""
        for proposer in self.proposers:
            limit = proposer.limit(seq, len(self.running))
            if limit is not None:
                return proposer, limit
        return None, 0

    def draft_limit(self, seq: Sequence) -> int:
        """The most drafts ``seq`` may ask for this step, before the step's caps: its proposer's limit (0: none)."""
        return self.proposer_for(seq)[1]

    def propose_drafts(self) -> None:
        """Drafts from each request's proposer, one batched call per proposer (it may give fewer). With a policy, the
        drafts worth their rows are fed; a proposer that costs passes (a draft model) is asked only for those."""
        caps = self.draft_caps()
        groups: dict[int, tuple[Proposer, list[Sequence]]] = {}
        for seq in self.running:
            if caps.get(seq.seq_id, 0) > 0:
                proposer = self.proposer_for(seq)[0]
                groups.setdefault(id(proposer), (proposer, []))[1].append(seq)
        if self.policy is not None and any(not p.cheap for p, _ in groups.values()):  # priced with its passes
            worth = self.choose({s.seq_id: [0] * caps[s.seq_id] for _, seqs in groups.values() for s in seqs}, False,
                                priced=True)
            for proposer, seqs in groups.values():
                if not proposer.cheap:  # asked only for what the policy would feed if every guess came
                    caps.update({s.seq_id: max(worth[s.seq_id], min(caps[s.seq_id], self.explore(proposer, seqs)))
                                 for s in seqs})
        drafts = {}
        for proposer, seqs in groups.values():  # a request with no guess is left out: the policy prices none
            asked = [s for s in seqs if caps[s.seq_id] > 0]
            guesses = proposer.propose(asked, [caps[s.seq_id] for s in asked]) if asked else []
            drafts.update({s.seq_id: list(d[:caps[s.seq_id]]) for s, d in zip(asked, guesses) if len(d)})
        ks = self.choose(drafts) if self.policy is not None else {i: len(d) for i, d in drafts.items()}
        for seq in (s for s in self.running if s.seq_id in drafts):
            seq.spec_token_ids = drafts[seq.seq_id][:ks[seq.seq_id]]

    def explore(self, proposer: Proposer, seqs: list[Sequence]) -> int:
        """1 draft a request while the policy explores ``proposer`` (cost_model.py), unless its pass costs a step."""
        rows, cost = sum(s.num_new_tokens for s in self.running), proposer.pass_cost
        cheap = cost is None or cost.seconds(len(seqs)) < self.policy.cost.seconds(rows, rows)
        return int(cheap and self.policy.exploring(type(proposer).__name__))

    def choose(self, drafts: dict[int, list[int]], record: bool = True, priced: bool = False) -> dict[int, int]:
        """seq_id -> how many of its drafts the policy feeds (``priced``: not made yet, their draft passes priced)."""
        base_tokens = sum(s.num_new_tokens == 1 for s in self.running)  # each decoding request's own token
        base_rows = min(sum(s.num_new_tokens for s in self.running), self.max_num_batched_tokens)
        seqs = [s for s in self.running if s.seq_id in drafts]
        proposers = [self.proposer_for(s)[0] for s in seqs]
        ks = self.policy.choose(seqs, [type(p).__name__ for p in proposers], [drafts[s.seq_id] for s in seqs],
                                base_tokens, base_rows, record, [p.pass_cost if priced else None for p in proposers])
        return {s.seq_id: k for s, k in zip(seqs, ks)}

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

    def abort(self, seq: Sequence) -> None:
        """Stage 03's, and the policy forgets the request at once (`postprocess` never sees it finish; the proposers
        drop theirs when they next see it finished)."""
        super().abort(seq)
        if self.policy is not None:
            self.policy.forget([seq.seq_id])

    def release(self) -> None:
        """Drop every request, and what the proposers hold for them (the draft model's KV blocks)."""
        super().release()
        for proposer in self.proposers:
            proposer.release()

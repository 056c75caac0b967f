"""Forced tokens for free: where the grammar allows exactly one next token, the engine knows it without sampling.

After ``{"name": "Ada", "`` a schema whose next key is ``"age"`` allows one token, then one more (``":``), and so
on: a run of forced tokens. `ForcedTokens.propose` reads that run off the request's constraint (each mask ahead is
kept for the runner's rows, so nothing is computed twice), and `ForcingScheduler` feeds it as draft tokens
(``Sequence.spec_token_ids``, the engine's seam for several tokens per step). The runner verifies drafts by exact
match: a forced token is the only one its row allows, so it is always kept, the generator draws once per token as
it would one at a time, and the tokens are exactly those of plain masked decoding, in fewer steps.

The proposer's interface (``propose(seq, k) -> list[int]``) is the one stage 06's proposers have; its scheduler will
call this one beside them.
"""
from __future__ import annotations

from common.sequence import Sequence

from .constraint import GrammarConstraint, single_token


def constraint_of(seq: Sequence) -> GrammarConstraint | None:
    return next((rule for rule in seq.processors if isinstance(rule, GrammarConstraint)), None)


class ForcedTokens:
    """Proposes the run of tokens the request's grammar forces from where it stands, at most ``k``."""

    def propose(self, seq: Sequence, k: int) -> list[int]:
        rule = constraint_of(seq)
        if rule is None or rule.error or rule.is_terminated():
            return []
        run: list[int] = []
        while len(run) < k:
            token = single_token(rule.mask())
            if token is None:
                break
            run.append(token)
            rule.accept(token)  # look ahead; taken back below
            if token in seq.eos_token_ids or rule.is_terminated():
                break
        if run:
            rule.rollback(len(run))
        return run


class ForcingScheduler:
    """Mixed into a scheduler (stage 07's engine.py): before each step, every decoding request with a constraint gets
    its forced run as drafts, capped so that the step's token budget holds them whole and no draft lies past
    max_tokens or the context."""
    proposer = ForcedTokens()
    max_forced = 16  # tokens per request per step (stage 07's engine option num_forced_tokens)

    def schedule(self):
        room = self.max_num_batched_tokens
        for seq in self.running:
            seq.spec_token_ids = []
            if self.max_forced and seq.num_new_tokens == 1 and room > 1 and seq.processors:
                limit = min(seq.params.max_tokens, (seq.max_len or 1 << 62) - seq.num_prompt_tokens)
                k = min(self.max_forced, room - 1, limit - len(seq.output_token_ids) - 1)
                if k > 0:
                    seq.spec_token_ids = self.proposer.propose(seq, k)
            room -= seq.num_new_tokens
        return super().schedule()

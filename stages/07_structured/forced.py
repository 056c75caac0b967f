"""Forced tokens for free: where the grammar allows exactly one next token, the engine knows it without sampling.

After ``{"name": "Ada"`` a schema whose next key is ``age`` forces the text ``, "age": ``, and after the last value
it forces ``}`` and then EOS. `ForcedTokens` is one more of stage 06's proposers (stages/06_speculative/proposer.py):
it asks each constrained request's `GrammarConstraint` for the run its grammar forces (``forced_tokens``), and stage
06's scheduler feeds that run as draft tokens (``Sequence.spec_token_ids``). The runner verifies drafts by exact
match, so the tokens are exactly those of plain masked decoding, in fewer steps: a token whose mask allows nothing
else is always kept; forced *text* is proposed as the tokenizer spells it, and kept where the model picks that
spelling (a byte-level vocabulary spells ``"age"`` many ways, each allowed, so it is rarely one forced token).

Stage 06's proposers still draft for the requests without a constraint; a constrained request takes its forced run
instead (this proposer comes first and claims it), since a guess the grammar forbids can never be kept.
"""
from __future__ import annotations

import time

from common.sequence import Sequence
from stages.speculative import Proposer  # stage 06: proposer.py

from .constraint import GrammarConstraint


def constraint_of(seq: Sequence) -> GrammarConstraint | None:
    return next((rule for rule in seq.processors if isinstance(rule, GrammarConstraint)), None)


class ForcedTokens(Proposer):
    """Proposes, for a request with a constraint, at most ``k`` tokens a step (``num_forced_tokens``; 0: none, plain
    masked decoding): the tokens its grammar forces, and the forced text as ``encode`` (the tokenizer) spells it.

    The look-ahead is bounded per step: a request's starts only while less than ``budget_us`` is spent (None: no
    bound; 0: none), each step starting where the last stopped. Forcing only proposes: the same tokens with any
    budget. ``masks`` (masks.py): every request's mask at its position filled first, in one call per backend."""

    def __init__(self, k: int, encode=None, budget_us: float | None = None, masks=None, clock=time.perf_counter):
        super().__init__(k)
        self.encode = encode  # the tokenizer's text -> ids; None: forced tokens alone
        self.budget_us, self.masks, self.clock = budget_us, masks, clock
        self.turn = 0  # where the next step's look-ahead starts
        self.forced = self.spelled = 0  # tokens proposed of each kind (the stage's measurement)
        self.seconds, self.served = 0.0, 0  # the look-ahead's time; the requests it looked ahead for, last step

    def claims(self, seq: Sequence) -> bool:
        return constraint_of(seq) is not None

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        rules = [constraint_of(seq) for seq in seqs]
        if self.masks is not None:
            self.masks.fill(rules)
        runs, start, served = [[] for _ in seqs], self.clock(), 0
        first = self.turn % len(seqs) if seqs else 0
        for j in range(len(seqs)):
            if self.budget_us is not None and (self.clock() - start) * 1e6 >= self.budget_us:
                break
            i = (first + j) % len(seqs)
            runs[i], forced, spelled = rules[i].forced_tokens(ks[i], self.encode)
            self.forced, self.spelled, served = self.forced + forced, self.spelled + spelled, served + 1
        self.turn = first + served
        self.seconds += self.clock() - start
        self.served = served
        return runs

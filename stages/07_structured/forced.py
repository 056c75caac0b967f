"""Forced tokens for free: where the grammar allows exactly one next token, the engine knows it without sampling.

After ``{"name": "Ada"`` a schema whose next key is ``age`` forces ``, "age": ``, and after the last value ``}`` and
EOS. `ForcedTokens`, one more of stage 06's proposers, asks each constrained request's `GrammarConstraint` for the
run its grammar forces (``forced_tokens``), fed as drafts (those stage 06's policy finds worth their rows) and
verified by exact match: plain masked decoding's tokens, in fewer steps (forced text is proposed as the tokenizer
spells it, kept where the model picks that spelling). First, it claims the constrained requests; stage 06's, the rest.
"""
from __future__ import annotations

import time

from common.sequence import Sequence
from stages.speculative import Proposer  # stage 06: proposer.py

from .constraint import GrammarConstraint


def constraint_of(seq: Sequence) -> GrammarConstraint | None:
    return next((rule for rule in seq.processors if isinstance(rule, GrammarConstraint)), None)


class ForcedTokens(Proposer):
    """At most ``k`` tokens a step (0: none) for a constrained request: those its grammar forces, then forced text as
    ``encode`` spells it. A look-ahead starts only while under ``budget_us`` this step (None: no bound), the next step
    going on from there (the same tokens). ``masks`` (masks.py): every mask filled first, in one call per backend."""
    cheap = False  # a look-ahead walks the grammar: the policy asks only for the drafts it would feed (scheduler.py)

    def __init__(self, k: int, encode=None, budget_us: float | None = None, masks=None, clock=time.perf_counter):
        super().__init__(k)
        self.encode = encode  # the tokenizer's text -> ids; None: forced tokens alone
        self.budget_us, self.masks, self.clock, self.turn = budget_us, masks, clock, 0  # turn: the next step's first
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
        self.seconds, self.served = self.seconds + self.clock() - start, served
        return runs

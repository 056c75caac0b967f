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

from common.sequence import Sequence
from stages.speculative import Proposer  # stage 06: proposer.py

from .constraint import GrammarConstraint


def constraint_of(seq: Sequence) -> GrammarConstraint | None:
    return next((rule for rule in seq.processors if isinstance(rule, GrammarConstraint)), None)


class ForcedTokens(Proposer):
    """Proposes, for a request with a constraint, at most ``k`` tokens a step (``num_forced_tokens``; 0: none, plain
    masked decoding): the tokens its grammar forces, and the forced text as ``encode`` (the tokenizer) spells it."""

    def __init__(self, k: int, encode=None):
        super().__init__(k)
        self.encode = encode  # the tokenizer's text -> ids; None: forced tokens alone
        self.forced = self.spelled = 0  # tokens proposed of each kind (the stage's measurement)

    def claims(self, seq: Sequence) -> bool:
        return constraint_of(seq) is not None

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        runs = []
        for seq, k in zip(seqs, ks):
            run, forced, spelled = constraint_of(seq).forced_tokens(k, self.encode)
            self.forced, self.spelled = self.forced + forced, self.spelled + spelled
            runs.append(run)
        return runs

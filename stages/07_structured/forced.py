"""Forced tokens for free: where the grammar allows exactly one next token, the engine knows it without sampling.

After ``{"name": "Ada"`` a schema whose next key is ``age`` forces the text ``, "age": ``, and after the last value
it forces ``}`` and then EOS. `ForcedTokens.propose` reads such runs off the request's constraint (each mask ahead
is kept for the runner's rows, so nothing is computed twice), and stage 07's scheduler (engine.py) feeds them as
draft tokens (``Sequence.spec_token_ids``) through stage 06's hooks, as one more proposer. The runner verifies
drafts by exact match, so the tokens are exactly those of plain masked decoding, in fewer steps: a token whose mask
allows nothing else is always kept; forced *text* is proposed as the tokenizer spells it, and kept where the model picks
that spelling (a byte-level vocabulary spells ``"age"`` many ways, each allowed, so it is rarely one forced token).

Stage 06's speculation still drafts for the requests without a constraint (its proposers' interface,
``propose(seqs, ks) -> drafts``, is this one's); a constrained request takes its forced run instead, since a guess
the grammar forbids can never be kept.
"""
from __future__ import annotations

from common.sequence import Sequence

from .constraint import GrammarConstraint, single_token


def constraint_of(seq: Sequence) -> GrammarConstraint | None:
    return next((rule for rule in seq.processors if isinstance(rule, GrammarConstraint)), None)


class ForcedTokens:
    """Proposes, at most ``k`` tokens: the tokens the request's grammar forces from where it stands (a mask with
    one token: always kept), and the text it forces written as the tokenizer writes it (kept where the model
    agrees: the grammar also allows other spellings of the same text, ``"`` + ``name`` for ``"name``)."""

    def __init__(self, encode=None):
        self.encode = encode  # the tokenizer's text -> ids; None: forced tokens alone
        self.forced = self.spelled = 0  # tokens proposed of each kind (the stage's measurement)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [self.run(seq, k) for seq, k in zip(seqs, ks)]

    def release(self) -> None:
        pass  # it holds nothing per request: the look-ahead is rolled back at once

    def run(self, seq: Sequence, k: int) -> list[int]:
        """The forced run of ``seq``: at most ``k`` tokens."""
        rule = constraint_of(seq)
        if rule is None or rule.error or rule.is_terminated():
            return []
        run: list[int] = []
        while len(run) < k and not rule.is_terminated():
            token = single_token(rule.mask())
            if token is not None:
                run.append(token)
                rule.accept(token)  # look ahead; taken back below
                self.forced += 1
                continue
            text = rule.matcher.forced_text() if self.encode is not None and rule.live == rule.pos else ""
            taken = 0
            for token in self.encode(text)[:k - len(run)] if text else []:
                words = rule.mask()
                if not words[token // 32] >> (token % 32) & 1:
                    break
                run.append(token)
                rule.accept(token)
                taken += 1
            self.spelled += taken
            if not taken:
                break
        if run:
            rule.rollback(len(run))
        return run

"""Forced tokens for free: where the grammar allows exactly one next token, the engine knows it without sampling.

After ``{"name": "Ada"`` a schema whose next key is ``age`` forces the text ``, "age": ``, and after the last value
it forces ``}`` and then EOS. `ForcedTokens.propose` reads such runs off the request's constraint (each mask ahead
is kept for the runner's rows, so nothing is computed twice), and `ForcingScheduler` feeds them as draft tokens
(``Sequence.spec_token_ids``, the engine's seam for several tokens per step). The runner verifies drafts by exact
match, so the tokens are exactly those of plain masked decoding, in fewer steps: a token whose mask allows
nothing else is always kept; forced *text* is proposed as the tokenizer spells it, and kept where the model picks
that spelling (a byte-level vocabulary spells ``"age"`` many ways, each allowed, so it is rarely one forced token).

The proposer's interface (``propose(seq, k) -> list[int]``) is the one stage 06's proposers have; its scheduler will
call this one beside them.
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

    def propose(self, seq: Sequence, k: int) -> list[int]:
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

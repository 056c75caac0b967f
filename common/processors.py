"""Logits processors: one request's rules on its logits row, an ordered list built per request.

Each rule is an object with ``apply(logits, output_ids)``, which changes the request's own float32 row in place,
seeing the output as it stands at the position being sampled. A rule may keep state that follows the tokens the
request keeps (a grammar's position): ``accept(token)`` after each kept token, ``rollback(n)`` when the last n are
taken back (a rejected draft), and ``is_terminated()`` when the output is complete, which ends the request like EOS.
A sample of ``n`` > 1 gets a chain of its own. The built-in rules are vLLM's, in vLLM's order: logit_bias,
allowed_token_ids, min_tokens, bad_words, repetition_penalty, then frequency_penalty and presence_penalty, each
elementwise on the one row from the request's own tokens, so its result never depends on the batch.
"""
from __future__ import annotations

import torch

from common.sampling import SamplingParams


class LogitsProcessor:
    """A rule with no state; subclasses override ``apply`` and, if they keep state, the other three."""
    # Set when the rule cannot go on (a grammar that no allowed token can continue): the request then ends with
    # finish_reason "error" and this message, alone; the batch around it is untouched.
    error: str | None = None

    def apply(self, logits: torch.Tensor, output_ids: list[int]) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        """The request kept ``token`` at the position after the last accepted one."""

    def rollback(self, num_tokens: int) -> None:
        """The last ``num_tokens`` accepted tokens were taken back."""

    def is_terminated(self) -> bool:
        return False


class LogitBias(LogitsProcessor):
    def __init__(self, bias: dict[int, float]):
        self.ids, self.values = list(bias), list(bias.values())

    def apply(self, logits, output_ids):
        logits[torch.tensor(self.ids, device=logits.device)] += torch.tensor(self.values, dtype=logits.dtype,
                                                                            device=logits.device)


class AllowedTokenIds(LogitsProcessor):
    def __init__(self, ids: list[int]):
        self.ids = ids

    def apply(self, logits, output_ids):
        keep = torch.zeros(logits.numel(), dtype=torch.bool, device=logits.device)
        keep[torch.tensor(self.ids, device=logits.device)] = True
        logits.masked_fill_(~keep, float("-inf"))


class MinTokens(LogitsProcessor):
    """No stop token (EOS, unless ignored, and stop_token_ids) before ``min_tokens`` are out."""

    def __init__(self, min_tokens: int, stop_ids: list[int]):
        self.min_tokens, self.stop_ids = min_tokens, stop_ids

    def apply(self, logits, output_ids):
        if len(output_ids) < self.min_tokens and self.stop_ids:
            logits[torch.tensor(self.stop_ids, device=logits.device)] = float("-inf")


class BadWords(LogitsProcessor):
    """vLLM's bad_words: a word's last token is banned wherever the output ends with the word's other tokens."""

    def __init__(self, words: list[list[int]]):
        self.words = words

    def apply(self, logits, output_ids):
        for word in self.words:
            head = word[:-1]
            if not head or output_ids[len(output_ids) - len(head):] == head:
                logits[word[-1]] = float("-inf")


class RepetitionPenalty(LogitsProcessor):
    """Tokens of the prompt and the output: positive logits divided by the penalty, negative multiplied."""

    def __init__(self, penalty: float, prompt_ids: list[int]):
        self.penalty, self.prompt_ids = penalty, prompt_ids

    def apply(self, logits, output_ids):
        seen = torch.zeros(logits.numel(), dtype=torch.bool, device=logits.device)
        seen[torch.tensor(self.prompt_ids + output_ids, dtype=torch.long, device=logits.device)] = True
        scaled = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        logits.copy_(torch.where(seen, scaled, logits))


class FrequencyPresencePenalty(LogitsProcessor):
    """Minus frequency x the token's count in the output, minus presence if it occurs there at all."""

    def __init__(self, frequency: float, presence: float):
        self.frequency, self.presence = frequency, presence

    def apply(self, logits, output_ids):
        if output_ids:
            counts = torch.bincount(torch.tensor(output_ids, device=logits.device),
                                    minlength=logits.numel()).to(logits.dtype)
            logits -= self.frequency * counts + self.presence * (counts > 0).to(logits.dtype)


def build_processors(params: SamplingParams, prompt_ids: list[int], eos_token_ids: frozenset[int],
                     bad_words_ids: list[list[int]] | None = None) -> list[LogitsProcessor]:
    """The request's built-in rules, in vLLM's order; empty when it has none (its rows are then not copied)."""
    p, chain = params, []
    if p.logit_bias:
        chain.append(LogitBias(p.logit_bias))
    if p.allowed_token_ids is not None:
        chain.append(AllowedTokenIds(p.allowed_token_ids))
    if p.min_tokens:
        eos = [] if p.ignore_eos else sorted(eos_token_ids)
        chain.append(MinTokens(p.min_tokens, eos + [t for t in p.stop_token_ids if t not in eos]))
    if bad_words_ids:
        chain.append(BadWords(bad_words_ids))
    if p.repetition_penalty != 1.0:
        chain.append(RepetitionPenalty(p.repetition_penalty, list(prompt_ids)))
    if p.frequency_penalty or p.presence_penalty:
        chain.append(FrequencyPresencePenalty(p.frequency_penalty, p.presence_penalty))
    return chain


def apply_processors(chain: list[LogitsProcessor], logits: torch.Tensor, output_ids: list[int]) -> torch.Tensor:
    """The row after every rule of ``chain``, in order, on a copy (the model's logits stay as they are)."""
    if not chain:
        return logits
    row = logits.clone()
    for rule in chain:
        rule.apply(row, output_ids)
    return row

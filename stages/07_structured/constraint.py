"""A request's grammar as a logits processor: the mask for the next position, kept in step with the kept tokens.

`GrammarConstraint`, stage 07's one processor (each sample of n > 1 its own), asks its matcher at each position for
the allowed tokens as a bitmask and sets every other logit to -inf on the request's own row (never batch-dependent);
it follows the kept tokens (``accept``), takes back a rejected draft (``rollback``) and says when the structure is
complete (``is_terminated``: an EOS accepted where the grammar may end). Its one driver is the request's `Sequence`;
a step's drafts and the forced run (``forced_tokens``, forced.py) are looked ahead along and come back. A mask is
computed once per position: ``masks`` keeps those along the path they were made for, for the runner's rows.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from common.processors import LogitsProcessor

from .fsm import pack

KEEP_BEHIND = 64  # masks kept for positions already passed: a rollback never goes further back than a step's drafts

# Each of a byte's 256 values as 8 additive biases, bit i -> entry i: 0.0 where the token is allowed, -inf where not.
BYTE_BIAS = np.where((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1, 0.0, -np.inf).astype(np.float32)


def apply_bitmask(row: torch.Tensor, words: np.ndarray) -> None:
    """Set to -inf, in place, every logit whose bit is 0 in ``words`` (bit i of int32 word j: token 32 j + i). On the
    CPU each mask byte is looked up as 8 biases added to the row (x + 0 = x, x + -inf = -inf): no branch per token,
    a third of the time of ``apply_bitmask_unpacked`` (a byte per token, then a masked fill), the same row."""
    if row.device.type == "cpu":
        bias = np.take(BYTE_BIAS, words.view(np.uint8), axis=0).reshape(-1)[:row.numel()]
        np.add(row.numpy(), bias, out=row.numpy())
    else:
        apply_bitmask_unpacked(row, words)


def apply_bitmask_unpacked(row: torch.Tensor, words: np.ndarray) -> None:
    """The same, spelled out: one byte per token (a 0 bans it), then one masked fill of the row."""
    keep = np.unpackbits(words.view(np.uint8), count=row.numel(), bitorder="little")
    row.masked_fill_(torch.from_numpy(keep).to(row.device) == 0, float("-inf"))


def single_token(words: np.ndarray) -> int | None:
    """The one token a mask allows, or None when it allows none or several."""
    nonzero = np.flatnonzero(words)
    if len(nonzero) != 1:
        return None
    word = int(words[nonzero[0]]) & 0xFFFFFFFF
    return None if word & (word - 1) else int(nonzero[0]) * 32 + word.bit_length() - 1


class GrammarConstraint(LogitsProcessor):
    def __init__(self, matcher, eos_ids: list[int], vocab_size: int, check_empty: bool = False,
                 name: str = "structured_outputs"):
        self.matcher, self.eos_ids, self.name = matcher, eos_ids, name
        self.eos_mask = pack(eos_ids[:1], vocab_size)
        self.check_empty = check_empty  # other rules ban tokens too: a row they leave empty is caught (this comes last)
        self.pos = 0  # tokens accepted
        self.live = 0  # of them, accepted by the matcher (all, unless the request failed)
        self.path: list[int] = []  # the tokens the memo below follows (the accepted ones, then any looked ahead)
        self.masks: list[np.ndarray | None] = []  # masks[q]: the mask at position q after path[:q]
        self.failures: dict[int, str] = {}  # position -> why no token was left there
        self.mask_seconds, self.mask_calls = 0.0, 0  # what the masks cost this request (the stage's measurement)

    def mask(self) -> np.ndarray:
        """The allowed tokens at the current position, computed once per position."""
        if len(self.masks) <= self.pos or self.masks[self.pos] is None:
            # Past the end (a row after an EOS that was drafted): EOS again, a defined row that is never kept.
            self.put(self.eos_mask if self.matcher.is_terminated() else self.matcher.fill())
        return self.masks[self.pos]

    def pending(self):
        """The matcher, while the current position's mask is not kept: what masks.py fills for many at once."""
        kept = len(self.masks) > self.pos and self.masks[self.pos] is not None
        return None if kept or self.live != self.pos or self.matcher.is_terminated() else self.matcher

    def put(self, mask: np.ndarray) -> None:
        self.masks += [None] * (self.pos + 1 - len(self.masks))
        self.masks[self.pos] = mask

    def mask_after(self, ahead: list[int]) -> np.ndarray:
        """The mask at the position after ``ahead`` (a step's drafts): kept from the look-ahead that proposed them
        (no step through the matcher), else looked ahead and come back."""
        end = self.pos + len(ahead)
        if end < len(self.masks) and self.masks[end] is not None and self.path[self.pos:end] == ahead:
            return self.masks[end]
        for token in ahead:
            self.accept(token)
        mask = self.mask()
        self.rollback(len(ahead))
        return mask

    def apply(self, logits: torch.Tensor, output_ids: list[int]) -> None:
        start = time.perf_counter()
        apply_bitmask(logits, self.mask())
        if self.check_empty and not bool(torch.isfinite(logits).any()):
            self.failures[self.pos] = (f"no token is allowed at output token {self.pos}: {self.name} allows only "
                                       f"tokens that the request's other rules (allowed_token_ids, bad_words, "
                                       f"min_tokens) ban")
            logits.fill_(float("-inf"))
            logits[self.eos_ids[0]] = 0.0  # a defined token to end on: the request fails with the message above
        self.mask_seconds += time.perf_counter() - start
        self.mask_calls += 1

    def accept(self, token: int) -> None:
        if not (self.pos < len(self.path) and self.path[self.pos] == token):  # off the path the masks ahead are for
            del self.path[self.pos:], self.masks[self.pos + 1:]
            self.path.append(token)
            for q in [q for q in self.failures if q > self.pos]:
                del self.failures[q]
        if self.live == self.pos and self.matcher.accept(token):
            self.live += 1
        elif self.live == self.pos and self.pos not in self.failures:
            self.failures[self.pos] = self.matcher.why or \
                f"{self.name} does not allow token {token} at output token {self.pos}"
        self.pos += 1
        if self.pos > KEEP_BEHIND and self.pos - KEEP_BEHIND < len(self.masks):
            self.masks[self.pos - KEEP_BEHIND] = None

    def rollback(self, num_tokens: int) -> None:
        self.pos -= num_tokens
        undo = self.live - min(self.live, self.pos)
        if undo:
            self.matcher.rollback(undo)
            self.live -= undo

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def forced_tokens(self, k: int, encode=None) -> tuple[list[int], int, int]:
        """At most ``k`` tokens the grammar forces from where the request stands, and how many were forced (a mask of
        one token) and spelled (forced text as ``encode``, the tokenizer, writes it); the state is as it was after."""
        if self.error or self.is_terminated():
            return [], 0, 0
        run, forced, spelled = [], 0, 0
        while len(run) < k and not self.is_terminated():
            token = single_token(self.mask())
            if token is not None:
                run.append(token)
                self.accept(token)  # look ahead; taken back below
                forced += 1
                continue
            text = self.matcher.forced_text() if encode is not None and self.live == self.pos else ""
            taken = 0
            for token in encode(text)[:k - len(run)] if text else []:
                if not self.mask()[token // 32] >> (token % 32) & 1:
                    break
                run.append(token)
                self.accept(token)
                taken += 1
            spelled += taken
            if not taken:
                break
        if run:
            self.rollback(len(run))
        return run, forced, spelled

    @property
    def error(self) -> str | None:
        """Why the request cannot go on, once the token at a position with no allowed token has been kept."""
        failed = [q for q in self.failures if q < self.pos]
        return self.failures[min(failed)] if failed else None

"""Proposers whose drafts cost (almost) nothing to make (each a `Proposer`, proposer.py).

* `NgramProposer`, vLLM's ``ngram`` method (prompt lookup decoding, Saxena 2023): text repeats itself (a summary
  quotes its source, code its identifiers), so what followed its last few tokens earlier on is proposed.
* `PredictionProposer`, OpenAI's predicted outputs: the output is drafted from the text the caller expects.
"""
from __future__ import annotations

import numpy as np

from common.sequence import Sequence

from .proposer import Proposer


def ngram_lookup(tokens: list[int], min_n: int, max_n: int, k: int, factor: float | None = None) -> list[int]:
    """vLLM's rule: up to ``k`` tokens that followed the first earlier occurrence of the longest suffix of ``tokens``
    of ``min_n`` to ``max_n`` tokens (none if none recurs): ``ngram_lookup([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]``;
    ``factor``: at most factor x n (a long match is a copy, a short one a guess). Fast: each earlier place of the last
    token (``list.index``, a scan in C) is a candidate end, extended back while the tokens agree (a longer one wins)."""
    # lab 06.1 begin: prompt lookup (n-gram) drafts
    end = len(tokens) - 1  # a match must end before the last token
    max_n = min(max_n, end)
    if max_n < min_n or end < 1:
        return []
    last, best_n, best_end, j = tokens[end], 0, -1, -1
    while best_n < max_n:
        try:
            j = tokens.index(last, j + 1, end)
        except ValueError:
            break
        n = 1
        while n < max_n and n <= j and tokens[j - n] == tokens[end - n]:
            n += 1
        if n > best_n:
            best_n, best_end = n, j
    k = k if factor is None else min(k, int(factor * best_n + 1e-6))
    return tokens[best_end + 1:best_end + 1 + k] if best_n >= min_n else []
    # lab 06.1 end


class NgramProposer(Proposer):
    """Drafts from the request's own prompt and output (``speculative_config`` method ``ngram``)."""

    def __init__(self, k: int, min_n: int, max_n: int, off: int | None = None, factor: float | None = None):
        super().__init__(k, off)  # off: disable_by_batch_size
        self.min_n, self.max_n, self.factor = min_n, max_n, factor

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [ngram_lookup(seq.token_ids, self.min_n, self.max_n, k, self.factor) for seq, k in zip(seqs, ks)]


class PredictionProposer(Proposer):
    """Drafts a request's predicted output on from where the output stands in it (past an edit: where its last tokens,
    up to ``max_n``, occur again, first after where it stood); while it is lost or used up, the method drafts."""

    def __init__(self, tokenizer, k: int, disable_by_batch_size: int | None = None, max_n: int = 8):
        super().__init__(k, disable_by_batch_size)
        self.tokenizer, self.max_n = tokenizer, max_n
        self.state: dict[int, tuple[Sequence, list[int], int, int | None]] = {}  # seq_id -> (seq, ids, out, at)

    def claims(self, seq: Sequence) -> bool:
        ids, at = self.follow(seq) if seq.params.prediction is not None else (None, None)
        return at is not None and at < len(ids) and np.array_equal(ids[max(at - 2, 0):at], seq.output_token_ids[-2:])

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        for seq in seqs:  # its drafts are the prediction's: OpenAI's usage counts them (common/engine.py's advance)
            seq.spec_from_prediction = True
        return [[] if at is None else ids[at:at + k].tolist() for (ids, at), k in zip(map(self.follow, seqs), ks)]

    def follow(self, seq: Sequence) -> tuple[np.ndarray, int | None]:
        """The prediction's ids and where the output stands in them (None: nowhere), caught up with its new tokens."""
        if seq.seq_id not in self.state:  # a new request: the finished go (claims follows some propose never asks)
            self.state = {i: s for i, s in self.state.items() if not s[0].is_finished}
        _, ids, seen, at = self.state.get(seq.seq_id) or (seq, self.prediction_ids(seq), 0, 0)
        out = seq.output_token_ids
        follows = at is not None and np.array_equal(ids[at:at + len(out) - seen], out[seen:])
        at = at + len(out) - seen if follows else self.realign(ids, out, at or 0)  # it departed: find it again
        self.state[seq.seq_id] = (seq, ids, len(out), at)
        return ids, at

    def prediction_ids(self, seq: Sequence) -> np.ndarray:
        ids = seq.prediction_ids  # tokenized when the request was prepared; else (a bare Sequence) here
        return np.asarray(self.tokenizer.encode(seq.params.prediction) if ids is None else ids, dtype=np.int64)

    def realign(self, ids: np.ndarray, out: list[int], floor: int) -> int | None:
        """Where in ``ids`` the output goes on: after the longest tail of ``out`` found there, preferring the first
        place at or after ``floor`` (where it stood); None when not even its last token occurs."""
        for n in range(min(self.max_n, len(out), len(ids)), 0, -1):
            tail = out[-n:]
            starts = np.flatnonzero(ids[:len(ids) - n + 1] == tail[0])  # then narrowed token by token
            for j in range(1, n):
                starts = starts[ids[starts + j] == tail[j]]
            if len(starts):
                later = starts[starts + n >= floor]
                return int((later[0] if len(later) else starts[0]) + n)
        return None

    def release(self) -> None:
        self.state.clear()

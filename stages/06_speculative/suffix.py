"""Suffix decoding (Oliaro et al., arXiv 2411.04975; Snowflake's Arctic Inference; vLLM's ``suffix`` method).

An agent that rewrites a file writes what it, or an earlier request, wrote before. Where prompt lookup (``ngram``)
copies what followed the last few tokens' first occurrence in this request, suffix decoding counts every
continuation in two trees, as Arctic's ``SuffixDecodingCache``: the request's own text, and the answers of the last
``suffix_decoding_max_cached_requests`` requests (first in, first out). Arctic's path compression is left out.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from common.sequence import Sequence

from .proposer import Proposer


class Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count, self.children = 0, {}  # children in the order they were made: of equal counts, the oldest wins


class Draft(NamedTuple):  # score: the sum of its tokens' probabilities; match_len: the context's tokens it follows
    tokens: list[int]
    score: float
    match_len: int


class SuffixTree:
    """Every stretch of up to ``depth`` tokens of each text fed, as paths from the root, each node counting its path."""

    def __init__(self, depth: int):
        self.depth, self.root = depth, Node()

    def add(self, tokens: list[int], sign: int = 1) -> None:
        """Count (``sign`` 1) or take back out (-1) every stretch of ``tokens`` (a whole text)."""
        for start in range(len(tokens)):
            self.walk(tokens[start:start + self.depth], sign)

    def extend(self, tokens: list[int], old: int) -> None:
        """The text grew from ``old`` tokens to ``len(tokens)``: count the stretches that reach the new ones."""
        for start in range(max(0, old - self.depth + 1), len(tokens)):
            self.walk(tokens[start:start + self.depth], 1, skip=max(0, old - start))

    def walk(self, stretch: list[int], sign: int, skip: int = 0) -> None:
        """``sign`` added to each count along ``stretch`` past ``skip`` tokens; a count of 0 removes the node."""
        node = self.root
        for i, token in enumerate(stretch):
            child = node.children.get(token) or node.children.setdefault(token, Node())
            child.count += sign if i >= skip else 0
            if child.count == 0:
                del node.children[token]
                return
            node = child

    def speculate(self, context: list[int], k: int, factor: float, min_prob: float, offset: float = 0.0) -> Draft:
        """Arctic's ``SuffixTree::speculate``: from each suffix of the context found here (1, 2, ... tokens), the most
        frequent path (a token's probability: child count over parent count, multiplied) while >= ``min_prob``, for
        at most ``factor`` x match length + ``offset`` and ``k`` tokens. The best score wins (a tie: the longer)."""
        context, best = context[-self.depth:], Draft([], 0.0, 0)
        for n in range(1, len(context)):
            node = self.root
            for token in context[-n:]:
                node = node.children.get(token) if node else None
            if node is None:  # no longer suffix is here either
                break
            draft, prob, score = [], 1.0, 0.0
            while len(draft) < min(k, int(n * factor + offset + 1e-6)) and node.children:
                token, child = max(node.children.items(), key=lambda kv: kv[1].count)
                prob *= child.count / node.count  # the parent's count: occurrences that end here count against
                if prob < min_prob:
                    break
                draft.append(token)
                score, node = score + prob, child
            best = Draft(draft, score, n) if score >= best.score else best
        return best


class SuffixProposer(Proposer):
    """Method ``suffix``: of the drafts of the request's tree and the global one, the higher score (a tie: its own)."""

    def __init__(self, k: int, depth: int, max_cached_requests: int, factor: float, min_prob: float,
                 disable_by_batch_size: int | None = None):
        super().__init__(k, disable_by_batch_size)
        self.depth, self.max_cached, self.factor, self.min_prob = depth, max_cached_requests, factor, min_prob
        self.own: dict[int, tuple[Sequence, SuffixTree, int]] = {}  # seq_id -> (seq, its tree, tokens fed to it)
        self.cached: OrderedDict[int, list[int]] = OrderedDict()  # the global tree's answers as fed, oldest first
        self.tree = SuffixTree(depth)  # the global tree

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        for seq_id in [i for i, (s, _, _) in self.own.items() if s.is_finished]:
            self.catch_up(self.own[seq_id][0])  # its answer stays in the global tree, whole; its own tree goes
            del self.own[seq_id]
        return [self.draft(seq, k) for seq, k in zip(seqs, ks)]

    def draft(self, seq: Sequence, k: int) -> list[int]:
        if seq.seq_id not in self.own:  # a new request: its tree, and a slot for its answer (the oldest leaves)
            self.own[seq.seq_id] = (seq, SuffixTree(self.depth), 0)
            if self.max_cached:
                self.cached[seq.seq_id] = []
            while len(self.cached) > self.max_cached:
                self.tree.add(self.cached.popitem(last=False)[1], sign=-1)
        context = seq.token_ids[-self.depth:]
        mine = self.catch_up(seq).speculate(context, k, self.factor, self.min_prob)
        earlier = self.tree.speculate(context, k, self.factor, self.min_prob)
        return (mine if mine.score >= earlier.score else earlier).tokens

    def catch_up(self, seq: Sequence) -> SuffixTree:
        """The tokens kept since last time into the request's tree and, while its slot lasts, the global one."""
        (_, tree, fed), tokens = self.own[seq.seq_id], seq.token_ids
        tree.extend(tokens, fed)
        self.own[seq.seq_id] = (seq, tree, len(tokens))
        answer = self.cached.get(seq.seq_id)
        if answer is not None:
            old = len(answer)
            answer.extend(seq.output_token_ids[old:])
            self.tree.extend(answer, old)
        return tree

    def release(self) -> None:
        self.own.clear()  # the requests' trees; the global one holds the answers, and stays

"""Suffix decoding (Oliaro et al., *SuffixDecoding*, arXiv 2411.04975; Snowflake's Arctic Inference; vLLM's
``suffix`` method): drafts from suffix trees of this request's text and of the answers of the requests before it.

An agent that rewrites the same file again and again writes what it, or an earlier request, wrote before. Prompt
lookup (``ngram``) copies what followed the first occurrence of the last few tokens, in this request alone;
suffix decoding keeps every continuation with its count. A `SuffixTree` holds every stretch of up to
``suffix_decoding_max_tree_depth`` tokens as counted paths from its root (Arctic's tree, less its path compression:
one node per token here, for the lesson). Two trees, as Arctic's ``SuffixDecodingCache``: one per request over its
prompt and output, and one global tree over the answers of the last ``suffix_decoding_max_cached_requests``
requests, each answer counted as it is generated (a running request's too) and, first in first out, taken back out
when a newer request needs its slot: bounded memory.

`SuffixTree.speculate` is Arctic's: every suffix of the last ``depth`` tokens that the tree holds (1, 2, ...
tokens, until one is missing) is a match; from each, the most frequent continuation is followed, each token's
estimated probability the product of child count over parent count along the path, while it stays >=
``suffix_decoding_min_token_prob``, for at most ``suffix_decoding_max_spec_factor`` x the match's length tokens;
a draft's score is the sum of its tokens' probabilities, and the best-scoring draft wins (a tie: the longer
match). Of the two trees' drafts, the higher score (a tie: the request's own).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from common.sequence import Sequence

from .proposer import Proposer


class Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count, self.children = 0, {}  # children in the order they were made: a tie goes to the oldest


class Draft(NamedTuple):
    tokens: list[int]
    score: float  # the sum of the tokens' estimated probabilities: the expected tokens kept, as the tree sees it
    match_len: int  # how many of the context's last tokens it was found after


class SuffixTree:
    """Every stretch of up to ``depth`` consecutive tokens of each text fed, counted, as paths from the root: a
    node's count is how often the path to it occurs in the texts."""

    def __init__(self, depth: int):
        self.depth, self.root = depth, Node()

    def add(self, tokens: list[int], sign: int = 1) -> None:
        """Count (``sign`` 1) or take back out (-1) every stretch of ``tokens`` (a whole text)."""
        for start in range(len(tokens)):
            self.walk(tokens[start:start + self.depth], sign)

    def extend(self, tokens: list[int], old: int) -> None:
        """The text grew from ``old`` tokens to ``len(tokens)``: count the stretches that reach the new ones."""
        for start in range(max(0, old - self.depth + 1), len(tokens)):
            stretch = tokens[start:start + self.depth]
            self.walk(stretch, 1, skip=max(0, old - start))

    def walk(self, stretch: list[int], sign: int, skip: int = 0) -> None:
        """Add ``sign`` to the count of each node along ``stretch`` past its first ``skip`` tokens (already
        counted); a node whose count falls to 0 is removed."""
        node = self.root
        for i, token in enumerate(stretch):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
            if i >= skip:
                child.count += sign
            if child.count == 0:  # nothing passes through it now, nor through what hangs below it
                del node.children[token]
                return
            node = child

    def find(self, tokens: list[int]) -> Node | None:
        node = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], k: int, factor: float, min_prob: float, offset: float = 0.0) -> Draft:
        """The best-scoring draft over every match length (Arctic's ``SuffixTree::speculate``); at most
        ``factor`` x match length + ``offset`` tokens (vLLM passes no offset), and ``k``."""
        context = context[-self.depth:]
        best = Draft([], 0.0, 0)
        for n in range(1, len(context)):  # the whole context is never a match, as in Arctic
            node = self.find(context[-n:])
            if node is None:  # no longer suffix is here either
                break
            tokens, score = follow(node, min(k, int(n * factor + offset + 1e-6)), min_prob)
            if score >= best.score:
                best = Draft(tokens, score, n)
        return best


def follow(node: Node, limit: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent path below ``node``, while its estimated probability stays >= ``min_prob``."""
    draft, prob, score = [], 1.0, 0.0
    while len(draft) < limit and node.children:
        token, child = max(node.children.items(), key=lambda kv: kv[1].count)  # the first made among equals
        prob *= child.count / node.count  # the parent's count: occurrences that end here count against
        if prob < min_prob:
            break
        draft.append(token)
        score += prob
        node = child
    return draft, score


class SuffixProposer(Proposer):
    """``speculative_config`` method ``suffix``: drafts from the request's own tree and the global one."""

    def __init__(self, k: int, depth: int, max_cached_requests: int, factor: float, min_prob: float,
                 disable_by_batch_size: int | None = None):
        super().__init__(k, disable_by_batch_size)
        self.depth, self.max_cached, self.factor, self.min_prob = depth, max_cached_requests, factor, min_prob
        self.own: dict[int, tuple[Sequence, SuffixTree, int]] = {}  # seq_id -> (seq, its tree, tokens fed to it)
        self.cached: OrderedDict[int, list[int]] = OrderedDict()  # the global tree's answers as fed, oldest first
        self.tree = SuffixTree(depth)  # the global tree

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        for seq_id in [i for i, (s, _, _) in self.own.items() if s.is_finished]:
            self.catch_up(self.own[seq_id][0])  # its answer stays in the global tree, whole; its tree goes
            del self.own[seq_id]
        return [self.draft(seq, k) for seq, k in zip(seqs, ks)]

    def draft(self, seq: Sequence, k: int) -> list[int]:
        if seq.seq_id not in self.own:
            self.start(seq)
        tree = self.catch_up(seq)
        context = seq.token_ids[-self.depth:]
        mine = tree.speculate(context, k, self.factor, self.min_prob)
        earlier = self.tree.speculate(context, k, self.factor, self.min_prob)
        return (mine if mine.score >= earlier.score else earlier).tokens

    def start(self, seq: Sequence) -> None:
        """A new request: its own tree, and a slot in the global tree for its answer; past the limit, the oldest
        answer is taken back out (Arctic evicts first in, first out)."""
        self.own[seq.seq_id] = (seq, SuffixTree(self.depth), 0)
        if self.max_cached == 0:
            return
        self.cached[seq.seq_id] = []
        while len(self.cached) > self.max_cached:
            self.tree.add(self.cached.popitem(last=False)[1], sign=-1)

    def catch_up(self, seq: Sequence) -> SuffixTree:
        """Feed the tokens kept since last time to the request's tree (prompt and output) and, while its slot
        lasts, its output to the global tree."""
        _, tree, fed = self.own[seq.seq_id]
        tokens = seq.token_ids
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

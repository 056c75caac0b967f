"""Suffix decoding (Oliaro et al., *SuffixDecoding*, arXiv 2411.04975; Snowflake's Arctic Inference; vLLM's
``suffix`` method): drafts from suffix trees of this request's text and of earlier requests' answers.

An agent that rewrites the same file again and again writes what it, or an earlier request, wrote before. Prompt
lookup (``ngram``) copies what followed the first occurrence of the last few tokens, in this request alone;
suffix decoding keeps every continuation with its count. A `SuffixTree` holds every stretch of up to
``suffix_decoding_max_tree_depth`` tokens as counted paths from its root: one per request (grown as tokens are
kept) and one global tree over the last ``suffix_decoding_max_cached_requests`` answers (the oldest's counts taken
back out: bounded memory). The draft follows the most frequent continuation of the longest suffix found, while its
estimated probability stays >= ``suffix_decoding_min_token_prob``, for at most ``suffix_decoding_max_spec_factor``
x the match's length; of the two trees' drafts, the one worth more expected tokens is proposed.
"""
from __future__ import annotations

from collections import OrderedDict

from common.sequence import Sequence

from .proposer import Proposer


class Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count, self.children = 0, {}


class SuffixTree:
    """Every stretch of up to ``depth`` consecutive tokens of each text fed, counted, as paths from the root."""

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

    def draft(self, context: list[int], k: int, factor: float, min_prob: float) -> tuple[list[int], float]:
        """The draft for ``context``: from the longest suffix of it that has a continuation here, the most frequent
        path; with its worth (the sum of each token's estimated probability)."""
        for n in range(min(self.depth - 1, len(context)), 0, -1):
            node = self.root
            for token in context[-n:]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None and node.children:
                return follow(node, min(k, int(factor * n)), min_prob)
        return [], 0.0


def follow(node: Node, limit: int, min_prob: float) -> tuple[list[int], float]:
    draft, prob, worth = [], 1.0, 0.0
    while len(draft) < limit and node.children:
        token, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
        prob *= child.count / sum(c.count for c in node.children.values())
        if prob < min_prob:
            break
        draft.append(token)
        worth += prob
        node = child
    return draft, worth


class SuffixProposer(Proposer):
    """``speculative_config`` method ``suffix``: drafts from the request's own tree and the global one."""

    def __init__(self, k: int, depth: int, max_cached_requests: int, factor: float, min_prob: float,
                 disable_by_batch_size: int | None = None):
        super().__init__(k, disable_by_batch_size)
        self.depth, self.max_cached, self.factor, self.min_prob = depth, max_cached_requests, factor, min_prob
        self.own: dict[int, tuple[Sequence, SuffixTree, int]] = {}  # seq_id -> (seq, its tree, tokens fed to it)
        self.cached: OrderedDict[int, list[int]] = OrderedDict()  # the global tree's answers, oldest first
        self.tree = SuffixTree(depth)  # the global tree

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        for seq_id in [i for i, (s, _, _) in self.own.items() if s.is_finished]:
            self.finish(seq_id)
        return [self.draft(seq, k) for seq, k in zip(seqs, ks)]

    def draft(self, seq: Sequence, k: int) -> list[int]:
        _, tree, fed = self.own.get(seq.seq_id) or (seq, SuffixTree(self.depth), 0)
        tokens = seq.token_ids
        tree.extend(tokens, fed)
        self.own[seq.seq_id] = (seq, tree, len(tokens))
        mine = tree.draft(tokens, k, self.factor, self.min_prob)
        earlier = self.tree.draft(tokens, k, self.factor, self.min_prob)
        return max(mine, earlier, key=lambda d: d[1])[0]

    def finish(self, seq_id: int) -> None:
        """A finished request's answer joins the global tree; past the limit the oldest answer leaves it."""
        seq, _, _ = self.own.pop(seq_id)
        if self.max_cached == 0 or not seq.output_token_ids:
            return
        self.cached[seq_id] = list(seq.output_token_ids)
        self.tree.add(self.cached[seq_id])
        while len(self.cached) > self.max_cached:
            self.tree.add(self.cached.popitem(last=False)[1], sign=-1)

    def release(self) -> None:
        self.own.clear()  # the requests' trees; the global one holds finished answers, and stays

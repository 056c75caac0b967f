"""The hand-written backend: a regular expression as an automaton over bytes, and the tokens each state allows.

Three steps, the whole idea of guided generation (Willard & Louf 2023):
1. the pattern (regex.py's tree) becomes a nondeterministic automaton over *bytes* (Thompson's construction; a
   character class becomes the UTF-8 byte sequences of its code points), read as a deterministic one whose states
   are sets of NFA states, built as they are reached (`DFA.row`);
2. the vocabulary is a trie of token bytes (`Trie`), built once per tokenizer;
3. a state allows the tokens whose every byte keeps the automaton alive: walk the trie and the automaton together,
   dropping a subtree at the first byte that kills it (`allowed_tokens`); EOS where the pattern may end.
A state's mask is computed the first time a request reaches it, then reused by every request of that pattern.
"""
from __future__ import annotations

import numpy as np

from .regex import MAX_CODE_POINT, Unsupported

MAX_NFA_STATES = 20_000  # a {n,m} repeat copies its body: past this, the pattern goes to xgrammar
SURROGATES = (0xD800, 0xDFFF)


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The code points lo..hi as UTF-8: a list of byte-range sequences (the classic split, as in RE2 and Rust's
    regex), surrogates left out. [(0xC2, 0xDF), (0x80, 0xBF)] is every 2-byte character."""
    if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
        return (utf8_sequences(lo, SURROGATES[0] - 1) if lo < SURROGATES[0] else []) + \
            (utf8_sequences(SURROGATES[1] + 1, hi) if hi > SURROGATES[1] else [])
    for edge in (0x7F, 0x7FF, 0xFFFF):  # one encoded length at a time
        if lo <= edge < hi:
            return utf8_sequences(lo, edge) + utf8_sequences(edge + 1, hi)
    for i in range(1, len(chr(lo).encode())):  # continuation bytes must span their full range, or split
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                return utf8_sequences(lo, lo | m) + utf8_sequences((lo | m) + 1, hi)
            if hi & m != m:
                return utf8_sequences(lo, (hi & ~m) - 1) + utf8_sequences(hi & ~m, hi)
    return [list(zip(chr(lo).encode(), chr(hi).encode()))]


class NFA:
    """Thompson's construction over bytes: ``edges[s]`` = [(low byte, high byte, next)], ``eps[s]`` = [next]."""

    def __init__(self, tree: tuple):
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.start, self.accept = self.build(tree)
        self.live = self.reaching_accept()

    def reaching_accept(self) -> frozenset[int]:
        """The states from which some byte sequence reaches the accepting state; the DFA drops the others (dead ends,
        ``a[^\\s\\S]``): a token leading only into one is never allowed, a pattern nothing matches is refused."""
        into: list[list[int]] = [[] for _ in self.eps]
        for s, (edges, eps) in enumerate(zip(self.edges, self.eps)):
            for t in [t for _, _, t in edges] + eps:
                into[t].append(s)
        seen, stack = {self.accept}, [self.accept]
        while stack:
            for s in into[stack.pop()]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return frozenset(seen)

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise Unsupported(f"the pattern needs more than {MAX_NFA_STATES:,} automaton states")
        self.edges.append([])
        self.eps.append([])
        return len(self.eps) - 1

    def build(self, node: tuple) -> tuple[int, int]:
        """A fragment for ``node``: (its entry state, its exit state)."""
        kind = node[0]
        start, end = self.new(), self.new()
        if kind == "set":
            for lo, hi in node[1]:
                for seq in utf8_sequences(lo, min(hi, MAX_CODE_POINT)):
                    at = start
                    for i, (a, b) in enumerate(seq):
                        nxt = end if i == len(seq) - 1 else self.new()
                        self.edges[at].append((a, b, nxt))
                        at = nxt
        elif kind == "cat":
            at = start
            for child in node[1]:
                s, e = self.build(child)
                self.eps[at].append(s)
                at = e
            self.eps[at].append(end)
        elif kind == "alt":
            for child in node[1]:
                s, e = self.build(child)
                self.eps[start].append(s)
                self.eps[e].append(end)
        else:  # ("repeat", child, low, high)
            _, child, low, high = node
            at = start
            for i in range(low if high is None else high):
                s, e = self.build(child)
                self.eps[at].append(s)
                if i >= low:  # the copies past the minimum may be skipped
                    self.eps[at].append(end)
                at = e
            if high is None:  # one more copy that loops
                s, e = self.build(child)
                self.eps[at] += [s, end]
                self.eps[e].append(s)
                self.eps[e].append(end)
            else:
                self.eps[at].append(end)
        return start, end

    def closure(self, states) -> frozenset[int]:
        seen, stack = set(states), list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


class DFA:
    """The NFA read deterministically: state i is a set of NFA states, its row of 256 next states built on first use
    (-1: no byte sequence from here can match)."""

    def __init__(self, nfa: NFA):
        self.nfa, self.sets, self.ids, self.rows = nfa, [], {}, []
        self.start = self.state(nfa.closure([nfa.start]))

    def state(self, nfa_states: frozenset[int]) -> int:
        nfa_states = nfa_states & self.nfa.live  # dead ends pruned: a state that cannot match is no state (-1)
        if not nfa_states:
            return -1
        if nfa_states not in self.ids:
            self.ids[nfa_states] = len(self.sets)
            self.sets.append(nfa_states)
            self.rows.append(None)
        return self.ids[nfa_states]

    def accepting(self, s: int) -> bool:
        return self.nfa.accept in self.sets[s]

    def row(self, s: int) -> list[int]:
        if self.rows[s] is None:
            targets: dict[int, set[int]] = {}
            for n in self.sets[s]:
                for lo, hi, t in self.nfa.edges[n]:
                    for b in range(lo, hi + 1):
                        targets.setdefault(b, set()).add(t)
            row = [-1] * 256
            for b, ts in targets.items():
                row[b] = self.state(self.nfa.closure(ts))
            self.rows[s] = row
        return self.rows[s]

    def walk(self, s: int, data: bytes) -> int:
        for b in data:
            s = self.row(s)[b]
            if s < 0:
                return -1
        return s


class Trie:
    """The vocabulary's tokens by their bytes: a node per prefix, ``tokens`` = the ids whose bytes end here."""
    __slots__ = ("children", "tokens")

    def __init__(self):
        self.children: dict[int, Trie] = {}
        self.tokens: list[int] = []

    @classmethod
    def build(cls, vocab: tuple[bytes | None, ...]) -> Trie:
        root = cls()
        for token_id, data in enumerate(vocab):
            if data:  # special tokens (None) and empty ones write nothing a pattern could match
                node = root
                for b in data:
                    node = node.children.get(b) or node.children.setdefault(b, cls())
                node.tokens.append(token_id)
        return root


def allowed_tokens(dfa: DFA, state: int, trie: Trie) -> list[int]:
    """Every token whose bytes, read from ``state``, keep the automaton alive: it may end in the middle of a match."""
    # lab 07.1 begin: walk the token trie against the automaton
    allowed, stack = [], [(trie, state)]
    while stack:
        node, s = stack.pop()
        row = dfa.row(s)
        for byte, child in node.children.items():
            nxt = row[byte]
            if nxt >= 0:  # alive: this token is allowed, and longer tokens through it may be
                allowed.extend(child.tokens)
                stack.append((child, nxt))
    return allowed
    # lab 07.1 end


def pack(token_ids, vocab_size: int) -> np.ndarray:
    """A set of token ids as xgrammar's bitmask layout: int32 words, bit i of word j is token 32 j + i."""
    bits = np.zeros(-(-vocab_size // 32) * 32, dtype=np.uint8)
    bits[np.asarray(list(token_ids), dtype=np.int64)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)

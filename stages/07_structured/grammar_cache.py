"""The compiled grammars a server keeps, bounded in bytes: least recently used out first.

A compiled grammar is shared by every request asking for the same constraint, but a count of entries bounds
nothing: one distinct 275 KB JSON schema compiles to tens of MiB on a 49,152-token vocabulary, and a client sending
distinct schemas would grow the server until the machine swaps. So the cache counts bytes (``max_bytes``, 256 MiB by
default; ``serve --grammar-cache-mb``) and drops the grammars used longest ago. It is the process's only cache of
compiled grammars (xgrammar's own is off, backends.py), or every grammar would be held twice, one copy unbounded.
A grammar's cost (`grammar_bytes`) is an estimate: xgrammar's, 1.5 x its ``memory_size_bytes`` (the process grew
1.2-1.25 x that per grammar kept); llguidance's (it reports no size), a base plus a factor x its grammar's text; the
automaton's, its masks, DFA rows and NFA states, measured again as it grows. A running request keeps its grammar.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

DEFAULT_MAX_BYTES = 256 * 2**20
XGRAMMAR_FACTOR = 1.5  # process bytes per byte of xgrammar's memory_size_bytes (measured 1.2-1.25; see above)
GUIDANCE_BASE_BYTES = 2**20  # a matcher's parser and lexer state
GUIDANCE_FACTOR = 32  # bytes held per byte of the grammar's text (lexer DFA states grow with the terminals)
NFA_STATE_BYTES = 200
DFA_ROW_BYTES = 256 * 8 + 64


def grammar_bytes(grammar) -> int:
    """The bytes a compiled grammar holds, estimated as the module's docstring says."""
    if grammar.backend == "xgrammar":
        return int(XGRAMMAR_FACTOR * grammar.compiled.memory_size_bytes)
    if grammar.backend == "guidance":
        return GUIDANCE_BASE_BYTES + GUIDANCE_FACTOR * grammar.source_bytes
    with grammar.lock:  # the engine thread may be adding a state
        masks = sum(m.nbytes for m in grammar.masks.values())
        return masks + DFA_ROW_BYTES * len(grammar.dfa.rows) + NFA_STATE_BYTES * len(grammar.dfa.nfa.eps)


class GrammarCache:
    """Key -> compiled grammar, least recently used first, their `grammar_bytes` kept under ``max_bytes`` (the newest
    kept even when larger alone: its request needs it). Thread-safe: requests are prepared on worker threads."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.entries: OrderedDict = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get(self, key, build: Callable[[], object]):
        """The grammar for ``key``, built with ``build()`` on a miss (outside the lock: a compilation may take
        seconds, and other keys must not wait for it; two threads missing the same key both build it once)."""
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                self.hits += 1
                return self.entries[key]
            self.misses += 1
        grammar = build()
        with self.lock:
            self.entries[key] = grammar
            self.entries.move_to_end(key)
            self.evict()
        return grammar

    def lookup(self, key):
        """The grammar for ``key`` if it is kept (counted as a hit), else None (nothing counted)."""
        with self.lock:
            if key not in self.entries:
                return None
            self.entries.move_to_end(key)
            self.hits += 1
            return self.entries[key]

    def evict(self) -> None:
        sizes = {key: grammar_bytes(g) for key, g in self.entries.items()}
        total = sum(sizes.values())
        while total > self.max_bytes and len(self.entries) > 1:
            key, _ = self.entries.popitem(last=False)
            total -= sizes[key]
            self.evictions += 1

    def nbytes(self) -> int:
        with self.lock:
            return sum(grammar_bytes(g) for g in self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def stats(self) -> dict[str, int]:
        """What /metrics shows: bytes held, the bound, entries, hits, misses and evictions since the start."""
        return {"bytes": self.nbytes(), "max_bytes": self.max_bytes, "entries": len(self.entries),
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}

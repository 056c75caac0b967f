"""The backends behind one interface: compile a constraint once, then a matcher per request.

A compiled grammar is shared by every request asking for the same constraint (``Grammars.compile`` caches it per
tokenizer); a matcher is one request's position in it: ``fill()`` the allowed tokens as a bitmask (int32 words,
xgrammar's layout), ``accept(token)``, ``rollback(n)``, ``is_terminated()`` (an EOS accepted where the grammar may
end), and ``forced_text()`` (the text every match must continue with: xgrammar's jump-forward string). ``choice`` and
the patterns regex.py reads go to the hand-written automaton (fsm.py); the rest to xgrammar (backend_xgrammar.py),
vLLM's default, or llguidance (backend_guidance.py); ``auto`` takes the first that enforces the whole constraint.
"""
from __future__ import annotations

import functools
import json
import threading

import numpy as np

from common.sampling import StructuredOutputsParams
from common.validate import InvalidParam

from .fsm import DFA, NFA, Trie, allowed_tokens, pack
from .grammar_cache import DEFAULT_MAX_BYTES, GrammarCache
from .regex import Unsupported, literal, parse
from .backend_guidance import compile_guidance, guidance_tokenizer
from .backend_xgrammar import compile_xgrammar, xgrammar_compiler
from .schema import CompileBudget, Refused, with_check, xgrammar_reason
from .vocab import token_bytes

TERMINATED = -2  # the matcher's state after an EOS at the end of a match
# auto's order: a JSON schema to llguidance first (faster to compile, enforces more); EBNF is xgrammar's dialect.
AUTO_ORDER = {"json": ("guidance", "xgrammar")}


class FSMGrammar:
    """A pattern's automaton and, per state reached so far, its mask (shared by all its requests)."""
    backend = "fsm"
    checked = ()  # a pattern is enforced whole: nothing left to check on the finished output

    def __init__(self, tree: tuple, grammars: Grammars):
        self.dfa, self.g = DFA(NFA(tree)), grammars
        self.masks: dict[int, np.ndarray] = {}
        # The DFA grows as requests reach new states, on the engine thread and those preparing requests: one at a time.
        self.lock = threading.Lock()

    def mask(self, state: int) -> np.ndarray:
        with self.lock:
            if state not in self.masks:
                if state < 0:  # TERMINATED, or -1: a pattern no string matches (its start state was pruned: fsm.py)
                    allowed = []
                else:
                    allowed = allowed_tokens(self.dfa, state, self.g.trie)
                    allowed += self.g.eos_ids if self.dfa.accepting(state) else []
                self.masks[state] = pack(allowed, self.g.vocab_size)
            return self.masks[state]

    def matcher(self) -> FSMMatcher:
        return FSMMatcher(self)

    def forced_text(self, state: int) -> str:
        """The text every match must continue with from ``state``: bytes while exactly one byte keeps it alive and
        the pattern cannot end there, cut to whole characters."""
        data, dfa = bytearray(), self.dfa
        with self.lock:
            while state >= 0 and not dfa.accepting(state) and len(data) < 256:
                live = [b for b, nxt in enumerate(dfa.row(state)) if nxt >= 0]
                if len(live) != 1:
                    break
                data.append(live[0])
                state = dfa.row(state)[live[0]]
        return bytes(data).decode("utf-8", errors="ignore")


class FSMMatcher:
    why = None  # a refusal's reason beyond the grammar's own (schema/checked.py's matcher has one)

    def __init__(self, grammar: FSMGrammar):
        self.grammar, self.states = grammar, [grammar.dfa.start]  # one state per accepted token, for rollback

    def fill(self) -> np.ndarray:
        return self.grammar.mask(self.states[-1])

    def accept(self, token: int) -> bool:
        s, dfa = self.states[-1], self.grammar.dfa
        if s < 0:
            return False
        if token in self.grammar.g.eos_ids:
            nxt = TERMINATED if dfa.accepting(s) else -1
        else:
            data = self.grammar.g.vocab[token] if token < len(self.grammar.g.vocab) else None
            with self.grammar.lock:
                nxt = dfa.walk(s, data) if data else -1
        if nxt == -1:
            return False
        self.states.append(nxt)
        return True

    def rollback(self, n: int) -> None:
        del self.states[len(self.states) - n:]

    def is_terminated(self) -> bool:
        return self.states[-1] == TERMINATED

    def forced_text(self) -> str:
        s = self.states[-1]
        return "" if s == TERMINATED else self.grammar.forced_text(s)


class Grammars:
    """One tokenizer's compiled constraints (an LRU cache bounded in bytes), its token trie and its compilers."""

    def __init__(self, folder: str, vocab_size: int, eos_ids: tuple[int, ...], cache_bytes: int = DEFAULT_MAX_BYTES):
        self.folder, self.vocab_size, self.eos_ids = folder, vocab_size, list(eos_ids)
        self.vocab = token_bytes(folder, vocab_size)
        self.cache = GrammarCache(cache_bytes)
        self.budget = CompileBudget()  # compiles in flight, each waited for at most a budget of seconds

    @functools.cached_property
    def trie(self) -> Trie:
        return Trie.build(self.vocab)

    @functools.cached_property
    def compiler(self):
        return xgrammar_compiler(self.vocab, self.vocab_size, self.eos_ids)

    @functools.cached_property
    def guidance(self):
        return guidance_tokenizer(self.folder, self.vocab_size, self.eos_ids)

    def compile(self, so: StructuredOutputsParams, backend: str = "auto", budget_s: float | None = None):
        """The compiled constraint (cached: grammar_cache.py); `InvalidParam` saying why when it cannot be enforced,
        or is not compiled within ``budget_s`` seconds (schema/compile_budget.py)."""
        key = (so.kind, json.dumps(so.schema, sort_keys=True) if so.kind == "json" else repr(getattr(so, so.kind)),
               so.disable_any_whitespace, backend)
        work = functools.partial(self.cache.get, key, lambda: self.build(so, backend))
        if budget_s is None:
            return work()
        hit = self.cache.lookup(key)
        return hit if hit is not None else self.budget.run(key, work, budget_s, so.kind)

    def build(self, so: StructuredOutputsParams, backend: str = "auto"):
        """The one compile entry: ``backend`` "fsm", "xgrammar", "guidance", or "auto" (the automaton for a choice or a
        simple pattern, then the first of ``AUTO_ORDER`` that enforces it all); `InvalidParam` saying why when none."""
        if so.kind in ("choice", "regex") and backend in ("auto", "fsm"):
            try:
                tree = ("alt", [literal(c) for c in so.choice]) if so.kind == "choice" else parse(so.regex)
                return FSMGrammar(tree, self)
            except Unsupported as e:
                if backend == "fsm":
                    raise InvalidParam("structured_outputs", f"structured_outputs.regex: {e}") from None
        tries = AUTO_ORDER.get(so.kind, ("xgrammar", "guidance")) if backend == "auto" else \
            ("guidance",) if backend == "guidance" else ("xgrammar",)
        reasons = []
        for name in tries:
            try:
                grammar = compile_xgrammar(self.compiler, so, self.vocab_size) if name == "xgrammar" else \
                    compile_guidance(self.guidance, so, self.vocab_size, self.eos_ids)
                return with_check(grammar, so.schema, self.vocab, self.eos_ids)
            except Refused as e:
                reasons.append(f"{name}: {e}")
            except (RuntimeError, ValueError) as e:
                reasons.append(f"{name} cannot compile it: {xgrammar_reason(e)[:300]}")
            except RecursionError:
                reasons.append(f"{name}: the schema is nested too deeply to read")
        raise InvalidParam("structured_outputs", f"structured_outputs.{so.kind}: "
                           f"{'no backend enforces it: ' if len(reasons) > 1 else ''}{'; '.join(reasons)}")


GRAMMARS: dict[tuple, Grammars] = {}  # every tokenizer's (and cache bound's) in this process
GRAMMARS_LOCK = threading.Lock()  # requests are prepared on several threads


def grammars_for(folder: str, vocab_size: int, eos_ids: tuple[int, ...],
                 cache_bytes: int = DEFAULT_MAX_BYTES) -> Grammars:
    """One `Grammars` per tokenizer (and cache bound) in this process, shared by the reference and every stage."""
    key = (folder, vocab_size, eos_ids, cache_bytes)
    with GRAMMARS_LOCK:
        if key not in GRAMMARS:
            GRAMMARS[key] = Grammars(folder, vocab_size, eos_ids, cache_bytes)
        return GRAMMARS[key]


def cache_stats(folder: str, cache_bytes: int) -> dict[str, int]:
    """The grammar caches' figures for one model folder and bound, summed over its EOS sets (usually one)."""
    with GRAMMARS_LOCK:
        caches = [g.cache for (f, _, _, b), g in GRAMMARS.items() if f == folder and b == cache_bytes]
    total = {"bytes": 0, "max_bytes": cache_bytes, "entries": 0, "hits": 0, "misses": 0, "evictions": 0}
    for cache in caches:
        total |= {k: v + total[k] for k, v in cache.stats().items() if k != "max_bytes"}
    return total

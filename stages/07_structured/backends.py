"""The two backends behind one interface: compile a constraint once, then a matcher per request.

A compiled grammar is shared by every request that asks for the same constraint (``Grammars.compile`` caches it
per tokenizer); a matcher is one request's position in it: ``fill()`` the allowed tokens as a bitmask (int32 words,
xgrammar's layout), ``accept(token)``, ``rollback(n)``, ``is_terminated()`` (an EOS was accepted where the grammar
may end), and ``forced_text()``, the text every match must continue with from here (xgrammar's jump-forward
string). ``choice`` and the patterns regex.py reads go to the hand-written automaton (fsm.py); JSON schemas,
``json_object``, EBNF grammars and other patterns to xgrammar (Dong et al. 2024, backend_xgrammar.py), the backend
vLLM defaults to, and llguidance (backend_guidance.py); ``auto`` takes the first of them that enforces the whole
constraint, as vLLM's ``auto`` falls back from one to the other.
"""
from __future__ import annotations

import functools
import json
from collections import OrderedDict

import numpy as np

from common.sampling import StructuredOutputsParams
from common.validate import InvalidParam

from .fsm import DFA, NFA, Trie, allowed_tokens, pack
from .regex import Unsupported, literal, parse
from .backend_guidance import compile_guidance, guidance_tokenizer
from .backend_xgrammar import compile_xgrammar, xgrammar_compiler
from .rewrites import Refused
from .schema_check import xgrammar_reason
from .vocab import token_bytes

TERMINATED = -2  # the matcher's state after an EOS at the end of a match
CACHE_SIZE = 256  # compiled grammars kept per tokenizer
# auto's order. A JSON schema goes to llguidance first: on JSONSchemaBench it compiles 10-100 times faster than
# xgrammar 0.2.9 (Snowplow's long maxLength strings took xgrammar seconds) and enforces more (allOf, a length beside
# a pattern); xgrammar takes what llguidance refuses. EBNF grammars are xgrammar's dialect, so xgrammar first there.
AUTO_ORDER = {"json": ("guidance", "xgrammar")}


class FSMGrammar:
    """A pattern's automaton and, per state reached so far, its mask (shared by all its requests)."""
    backend = "fsm"

    def __init__(self, tree: tuple, grammars: Grammars):
        self.dfa, self.g = DFA(NFA(tree)), grammars
        self.masks: dict[int, np.ndarray] = {}

    def mask(self, state: int) -> np.ndarray:
        if state not in self.masks:
            if state == TERMINATED:
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
        while state >= 0 and not dfa.accepting(state) and len(data) < 256:
            live = [b for b, nxt in enumerate(dfa.row(state)) if nxt >= 0]
            if len(live) != 1:
                break
            data.append(live[0])
            state = dfa.row(state)[live[0]]
        return bytes(data).decode("utf-8", errors="ignore")


class FSMMatcher:
    def __init__(self, grammar: FSMGrammar):
        self.grammar, self.states = grammar, [grammar.dfa.start]  # one state per accepted token, for rollback

    def fill(self) -> np.ndarray:
        return self.grammar.mask(self.states[-1])

    def accept(self, token: int) -> bool:
        s, dfa = self.states[-1], self.grammar.dfa
        if s == TERMINATED:
            return False
        if token in self.grammar.g.eos_ids:
            nxt = TERMINATED if dfa.accepting(s) else -1
        else:
            data = self.grammar.g.vocab[token] if token < len(self.grammar.g.vocab) else None
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
    """One tokenizer's compiled constraints (an LRU cache), its token trie and its xgrammar compiler."""

    def __init__(self, folder: str, vocab_size: int, eos_ids: tuple[int, ...]):
        self.folder, self.vocab_size, self.eos_ids = folder, vocab_size, list(eos_ids)
        self.vocab = token_bytes(folder, vocab_size)
        self.cache: OrderedDict = OrderedDict()

    @functools.cached_property
    def trie(self) -> Trie:
        return Trie.build(self.vocab)

    @functools.cached_property
    def compiler(self):
        return xgrammar_compiler(self.vocab, self.vocab_size, self.eos_ids)

    @functools.cached_property
    def guidance(self):
        return guidance_tokenizer(self.folder, self.vocab_size, self.eos_ids)

    def compile(self, so: StructuredOutputsParams, backend: str = "auto"):
        """The compiled constraint (cached); `InvalidParam` with the reason when it cannot be enforced."""
        key = (so.kind, json.dumps(so.schema, sort_keys=True) if so.kind == "json" else repr(getattr(so, so.kind)),
               so.disable_any_whitespace, backend)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        grammar = self.build(so, backend)
        self.cache[key] = grammar
        if len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return grammar

    def build(self, so: StructuredOutputsParams, backend: str = "auto"):
        """The one compile entry: ``backend`` "fsm", "xgrammar", "guidance", or "auto" (the hand-written automaton
        for a choice or a simple pattern, then the backends in ``AUTO_ORDER``: the first that enforces the whole
        constraint). `InvalidParam` naming the keyword, its place and why when none does."""
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
                if name == "xgrammar":
                    return compile_xgrammar(self.compiler, so, self.vocab_size)
                return compile_guidance(self.guidance, so, self.vocab_size, self.eos_ids)
            except Refused as e:
                reasons.append(f"{name}: {e}")
            except (RuntimeError, ValueError) as e:
                reasons.append(f"{name} cannot compile it: {xgrammar_reason(e)[:300]}")
            except RecursionError:
                reasons.append(f"{name}: the schema is nested too deeply to read")
        raise InvalidParam("structured_outputs", f"structured_outputs.{so.kind}: "
                           f"{'no backend enforces it: ' if len(reasons) > 1 else ''}{'; '.join(reasons)}")


@functools.cache
def grammars_for(folder: str, vocab_size: int, eos_ids: tuple[int, ...]) -> Grammars:
    """One `Grammars` per tokenizer in this process: the reference and every stage share its compiled grammars."""
    return Grammars(folder, vocab_size, eos_ids)

"""llguidance (Microsoft's guidance, the second backend vLLM ships): an Earley parser over a lexer, which enforces
``allOf``, ``minLength`` beside a ``pattern``, and refuses (never skips) a keyword it does not implement.

The same interface as xgrammar's matcher (backend_xgrammar.py), two differences handled here: a token llguidance
does not allow breaks its matcher for good, so a token is checked (``validate_tokens``) before it is taken; and an
EOS is never given to llguidance (rolled back, it left EOS refused in 1.9.1): it is counted here (``is_terminated``).
"""
from __future__ import annotations

import numpy as np

from .schema import guidance_refusal, loosens, prepare


class GuidanceGrammar:
    backend = "guidance"

    def __init__(self, matcher, vocab_size: int, eos_ids: list[int], source_bytes: int = 0, checked=()):
        self.start, self.vocab_size, self.eos_ids, self.checked = matcher, vocab_size, eos_ids, list(checked)
        self.source_bytes = source_bytes  # the grammar's text, for the cache's estimate of its size

    def matcher(self) -> GuidanceMatcher:
        return GuidanceMatcher(self)


class GuidanceMatcher:
    why = None  # a refusal's reason beyond the grammar's own (schema/checked.py's matcher has one)

    def __init__(self, grammar: GuidanceGrammar):
        self.m, self.eos_ids = grammar.start.deep_copy(), grammar.eos_ids
        self.words = -(-grammar.vocab_size // 32)
        self.taken, self.ended_at = 0, -1  # tokens accepted; how many had been when EOS was

    def fill(self) -> np.ndarray:
        bitmask = np.zeros(self.words, dtype=np.int32)
        if not self.is_terminated():
            self.m.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
        return bitmask

    def accept(self, token: int) -> bool:
        if self.is_terminated():
            return False
        if token in self.eos_ids:  # kept out of llguidance: its rollback of an EOS leaves EOS refused after
            if not self.m.is_accepting():
                return False
            self.ended_at = self.taken
        elif self.m.validate_tokens([token]) != 1 or not self.m.consume_token(token):
            return False
        self.taken += 1
        return True

    def rollback(self, n: int) -> None:
        if n:
            ended = self.is_terminated() and self.ended_at >= self.taken - n
            if n - ended:
                self.m.rollback(n - ended)
            self.taken -= n
            self.ended_at = -1 if ended else self.ended_at

    def is_terminated(self) -> bool:
        return self.ended_at >= 0

    def forced_text(self) -> str:
        return "" if self.is_terminated() else self.m.compute_ff_bytes().decode("utf-8", errors="ignore")


def guidance_tokenizer(folder: str, vocab_size: int, eos_ids: list[int]):
    """llguidance's view of the model folder's tokenizer.json (its special tokens never allowed inside a grammar)."""
    import llguidance as llg
    return llg.LLTokenizer(f"{folder}/tokenizer.json", n_vocab=vocab_size, eos_token=eos_ids)


def compile_guidance(tokenizer, so, vocab_size: int, eos_ids: list[int]) -> GuidanceGrammar:
    """The constraint as llguidance's grammar; ValueError with llguidance's reason when it cannot enforce it."""
    import llguidance as llg
    flexible = not so.disable_any_whitespace
    options = {"whitespace_flexible": flexible, "coerce_one_of": False, "lenient": False}
    if not flexible:  # xgrammar's compact spelling: {"a": 1, "b": [2, 3]}
        options.update(item_separator=", ", key_separator=": ")
    cleaned = prepare(so.schema, "guidance") if so.kind == "json" else None
    schema = cleaned.schema if cleaned else {"type": "object"}
    if so.kind in ("json", "json_object"):
        grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    elif so.kind == "regex":
        grammar = llg.LLMatcher.grammar_from_regex(so.regex)
    elif so.kind == "choice":
        grammar = llg.LLMatcher.grammar_from_regex("|".join(regex_literal(c) for c in so.choice))
    else:
        raise ValueError("llguidance reads Lark grammars; structured_outputs.grammar is xgrammar's EBNF")
    matcher, error = build_matcher(tokenizer, grammar)
    if error and cleaned is not None and loosens(error):
        # a pattern-matched property through a recursive definition, a property count beside optional ones: the
        # loose cleaning leaves these to the check of the finished output
        cleaned = prepare(so.schema, "guidance", loose=True)
        schema = cleaned.schema
        grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        matcher, error = build_matcher(tokenizer, grammar)
    if error:
        raise guidance_refusal(error, schema)
    return GuidanceGrammar(matcher, vocab_size, eos_ids, len(grammar), cleaned.checked if cleaned else ())


def build_matcher(tokenizer, grammar: str):
    """The matcher at the grammar's start and llguidance's error ("" when none). Building it is the compile (lexer
    and parser tables, without the interpreter lock): no ``validate_grammar`` first, which did the same work again."""
    import llguidance as llg
    matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
    return matcher, matcher.get_error() if matcher.is_error() else ""


def regex_literal(text: str) -> str:
    return "".join("\\" + c if c in r"\.^$|?*+()[]{}/" else c for c in text)

"""xgrammar (Dong et al. 2024), the backend vLLM defaults to: JSON schemas it enforces whole, EBNF grammars, regexes.

A compiled grammar is shared; a matcher is one request's position in it, behind backends.py's interface (its
``forced_text()`` is xgrammar's jump-forward string). A schema is first made one xgrammar enforces whole
(``schema.prepare``): xgrammar would skip a keyword it does not enforce.
"""
from __future__ import annotations

import json

import numpy as np

from .schema import prepare


class XGrammarGrammar:
    backend = "xgrammar"

    def __init__(self, compiled, vocab_size: int, checked=()):
        self.compiled, self.vocab_size, self.checked = compiled, vocab_size, list(checked)

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self)


class XGrammarMatcher:
    why = None  # a refusal's reason beyond the grammar's own (schema/checked.py's matcher has one)

    def __init__(self, grammar: XGrammarGrammar):
        import xgrammar as xgr
        self.m = xgr.GrammarMatcher(grammar.compiled)
        self.words = -(-grammar.vocab_size // 32)

    def fill(self) -> np.ndarray:
        import torch
        bitmask = torch.empty((1, self.words), dtype=torch.int32)
        self.m.fill_next_token_bitmask(bitmask)
        return bitmask.numpy()[0]

    def accept(self, token: int) -> bool:
        return not self.m.is_terminated() and self.m.accept_token(token)

    def rollback(self, n: int) -> None:
        self.m.rollback(n)

    def is_terminated(self) -> bool:
        return self.m.is_terminated()

    def forced_text(self) -> str:
        return "" if self.m.is_terminated() else self.m.find_jump_forward_string()


def xgrammar_compiler(vocab: tuple, vocab_size: int, eos_ids: list[int]):
    """xgrammar's compiler over this vocabulary: special tokens as empty strings, never allowed inside a structure (as
    text, ``<|im_start|>`` would be, in a JSON string). Its own cache is off: grammar_cache.py is the one, bounded."""
    import xgrammar as xgr
    info = xgr.TokenizerInfo([b if b is not None else b"" for b in vocab], vocab_type=xgr.VocabType.RAW,
                             vocab_size=vocab_size, stop_token_ids=eos_ids)
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def compile_xgrammar(compiler, so, vocab_size: int) -> XGrammarGrammar:
    """The constraint compiled; `Refused` for a keyword xgrammar would skip, RuntimeError/ValueError if it fails."""
    any_whitespace, checked = not so.disable_any_whitespace, ()
    if so.kind == "json":
        cleaned = prepare(so.schema, "xgrammar", compiler)
        schema, checked = cleaned.schema, cleaned.checked
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
    elif so.kind == "json_object":  # vLLM's: an object (the builtin JSON grammar would take any value)
        compiled = compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace)
    elif so.kind == "regex":
        compiled = compiler.compile_regex(so.regex)
    elif so.kind == "choice":  # only when the hand-written backend is not wanted
        compiled = compiler.compile_grammar("root ::= " + " | ".join(json.dumps(x) for x in so.choice))
    else:
        compiled = compiler.compile_grammar(so.grammar)
    return XGrammarGrammar(compiled, vocab_size, checked)

"""What a grammar cannot say, checked on the finished output: an output that breaks it never ends as a success.

A grammar describes a context-free language; two keywords real schemas use are not: ``uniqueItems`` ("no item
twice", whatever the items) and ``oneOf`` whose branches may overlap ("exactly one branch", a grammar can only say
"at least one"). The cleaning (rewrites.py) gives the backend the schema without them (``uniqueItems`` dropped,
``oneOf`` as ``anyOf``): every constraint left is enforced token by token, and what was dropped is listed
(``Cleaned.checked``). The matcher here follows the backend's and keeps the output's bytes; when the model asks to
end (EOS where the grammar may end), the output is validated with ``jsonschema`` against the *original* schema
under its own draft. Valid: it ends as any output does. Invalid: EOS is refused with a reason that names the
keyword, so the request fails alone with that message (a 400 through the server), never a "stop" with an output
that breaks its schema. The 400 says why: the model wrote, say, the same tag twice, which the grammar could not
forbid. ``coverage`` counts these schemas apart ("served, checked at the end") and the generations that fail.
"""
from __future__ import annotations

import json

import numpy as np


class CheckedGrammar:
    """A backend's compiled grammar and the original schema its matchers check the finished output against."""

    def __init__(self, inner, schema, checked: list[str], vocab, eos_ids: list[int]):
        from jsonschema.validators import validator_for
        self.inner, self.checked, self.vocab, self.eos_ids = inner, checked, vocab, eos_ids
        self.backend = inner.backend
        # what the grammar cache's estimate of the size reads, by backend (grammar_cache.grammar_bytes)
        self.compiled = inner.compiled if inner.backend == "xgrammar" else None
        self.source_bytes = inner.source_bytes if inner.backend == "guidance" else 0
        self.validator = validator_for(schema)(schema)

    def matcher(self) -> CheckedMatcher:
        return CheckedMatcher(self)

    def problem(self, text: str) -> str | None:
        """Why ``text`` does not meet the original schema, or None when it does."""
        try:
            error = next(self.validator.iter_errors(json.loads(text)), None)
        except ValueError as e:
            return f"the output is not JSON ({e})"
        except Exception as e:  # noqa: BLE001 - jsonschema cannot read a part of the schema (a regex Python lacks)
            return f"jsonschema cannot check it ({type(e).__name__}: {str(e)[:120]})"
        if error is None:
            return None
        place = "#" + "".join(f"/{p}" for p in error.absolute_path)
        return f"at {place}: {error.message[:200]}"


class CheckedMatcher:
    def __init__(self, grammar: CheckedGrammar):
        self.grammar, self.m = grammar, grammar.inner.matcher()
        self.pieces: list[bytes] = []  # each accepted token's bytes, for rollback
        self.why: str | None = None  # why the last EOS was refused

    def fill(self) -> np.ndarray:
        return self.m.fill()

    def accept(self, token: int) -> bool:
        g = self.grammar
        if token in g.eos_ids and not self.m.is_terminated() and self.allows(token):
            problem = g.problem(b"".join(self.pieces).decode("utf-8", errors="replace"))
            if problem is not None:
                self.why = (f"the output breaks its schema {problem}; {', '.join(g.checked)} cannot be said by a "
                            f"grammar, so it is checked when the output ends, and this output fails rather than end "
                            f"as a success")
                return False
        if not self.m.accept(token):
            return False
        self.pieces.append(b"" if token in g.eos_ids else g.vocab[token] or b"")
        return True

    def allows(self, token: int) -> bool:
        """The grammar may end here (an EOS elsewhere is the backend's to refuse, with its own reason)."""
        return bool(int(self.m.fill()[token // 32]) >> (token % 32) & 1)

    def rollback(self, n: int) -> None:
        self.m.rollback(n)
        del self.pieces[len(self.pieces) - n:]

    def is_terminated(self) -> bool:
        return self.m.is_terminated()

    def forced_text(self) -> str:
        return self.m.forced_text()


def with_check(grammar, schema, vocab, eos_ids: list[int]):
    """``grammar`` as it is, or wrapped to check the finished output where its cleaning dropped a keyword."""
    return CheckedGrammar(grammar, schema, grammar.checked, vocab, eos_ids) if grammar.checked else grammar

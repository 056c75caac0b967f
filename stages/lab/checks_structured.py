"""The grader of stage 07: the token-trie walk against its definition (every token's bytes read one by one through
the automaton) on SmolLM2's real vocabulary cut to the tiny model's 1,024 tokens, then the learner's stage against
the reference with the same constraint, token for token."""
from __future__ import annotations

import importlib

from hypothesis import given, strategies as st

from common.prepare import resolve_model
from common.sampling import SamplingParams

from .examples import hypothesis, reference

PATTERNS = [r"(yes|no|maybe)", r"\d{2}[a-c]+", r'"[^"]{0,5}"', r"[A-Z][a-z]+ ?", r".{0,2}z"]


def reachable(dfa, limit: int = 10) -> list[tuple[int, bytes]]:
    """Up to ``limit`` states from the start, each with the shortest bytes that reach it."""
    found, queue = {dfa.start: b""}, [dfa.start]
    while queue and len(found) < limit:
        s = queue.pop(0)
        for b, nxt in enumerate(dfa.row(s)):
            if nxt >= 0 and nxt not in found:
                found[nxt] = found[s] + bytes([b])
                queue.append(nxt)
    return list(found.items())[:limit]


def check_07_1(v) -> None:
    fsm = v.module("fsm")
    backends = v.module("backends")
    grammars = backends.Grammars(str(resolve_model("tiny")), 1024, (2,))
    for pattern in PATTERNS:
        dfa = fsm.DFA(fsm.NFA(backends.parse(pattern)))
        for state, prefix in reachable(dfa):
            want = {t for t, data in enumerate(grammars.vocab) if data and dfa.walk(state, data) >= 0}
            got = set(fsm.allowed_tokens(dfa, state, grammars.trie))
            missing, extra = sorted(want - got), sorted(got - want)
            assert not missing and not extra, (
                f"pattern {pattern!r} after the text {prefix!r}: "
                + (f"token {missing[0]} ({grammars.vocab[missing[0]]!r}) keeps the automaton alive but is not "
                   f"allowed ({len(missing)} such)" if missing else
                   f"token {extra[0]} ({grammars.vocab[extra[0]]!r}) is allowed but its bytes leave the pattern "
                   f"({len(extra)} such)"))
    engine = v.module("engine")
    ref = type("Ref", (importlib.import_module("stages.07_structured").StructuredOutputs, type(reference())), {})(
        "tiny", dtype="bfloat16")

    @hypothesis(4)
    @given(pattern=st.sampled_from(PATTERNS[:4]), seed=st.integers(0, 1000), greedy=st.booleans())
    def same_tokens(pattern, seed, greedy):
        params = SamplingParams(temperature=0 if greedy else 1.0, seed=seed, max_tokens=12,
                                structured_outputs={"regex": pattern})
        expected = ref.generate([[5, 6, 7]], params)[0]
        got = engine.LLM("tiny", dtype="bfloat16").generate([[5, 6, 7]], params)[0]
        why = f": {got.error}" if got.error else ""
        assert (got.token_ids, got.finish_reason) == (expected.token_ids, expected.finish_reason), (
            f"pattern {pattern!r}, {'greedy' if greedy else f'seed {seed}'}: expected {expected.text!r} "
            f"({expected.finish_reason}), produced {got.text!r} ({got.finish_reason}{why})")
    same_tokens()

"""Stage 07's exact rewrites of dependencies, overlapping property patterns and a ``type`` beside ``anyOf``, and the
keywords checked on the finished output (``uniqueItems``, ``oneOf`` whose branches may overlap).

The oracle is ``jsonschema`` on the original schema under its own draft: a rewritten schema accepts exactly what
the original does; a checked schema's matcher ends (EOS accepted) only on an output that validates, and refuses EOS,
with a reason naming the keyword, only on one that does not. Tiny model's vocabulary (SmolLM2's first 1,024 tokens).
"""
import importlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema.validators import validator_for

pytest.importorskip("llguidance")
rewrites = importlib.import_module("stages.structured.schema.rewrites")

REWRITTEN = [
    {"type": "object", "dependentRequired": {"a": ["b"], "c": ["b", "k"]}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
     "dependencies": {"a": {"properties": {"b": {"enum": [1, 2]}}}, "c": ["a"]}},
    {"type": "object", "dependentSchemas": {"a": {"required": ["b"], "properties": {"b": {"type": "string"}}},
                                            "k": False}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
     "patternProperties": {"^[ab]$": {"type": "integer"}}},
    {"type": "array", "items": {"type": "object", "anyOf": [{"$ref": "#/$defs/o"}, {"$ref": "#/$defs/p"}]},
     "$defs": {"o": {"type": "object", "required": ["a"]}, "p": {"type": "object", "properties": {"b": {}}}}},
    {"type": ["object", "string"], "anyOf": [{"type": "object", "required": ["a"]}, {"type": "integer"}]},
    {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}, {"required": ["c"]}]},
    {"type": "object", "oneOf": [{"properties": {"a": {}}, "additionalProperties": False},
                                 {"required": ["b"], "properties": {"b": {}}}]},
    {"oneOf": [{"enum": ["x", "yy", 3]}, {"type": "string", "minLength": 3}, {"type": "integer", "minimum": 4}]},
    {"type": "object", "propertyNames": {"enum": ["a", "b"]}, "properties": {"a": {"type": "integer"}, "k": {}},
     "additionalProperties": {"type": "string"}},
    {"type": "object", "propertyNames": {"$ref": "#/$defs/n"}, "additionalProperties": {"type": "integer"},
     "$defs": {"n": {"type": "string", "pattern": "^[a-b]$", "description": "a name"}}},
    {"type": "object", "propertyNames": {"pattern": "^[abc]"}, "patternProperties": {".*": {"type": "integer"}},
     "properties": {"a": {"minimum": 3}, "k": {}}},
    {"type": "object", "propertyNames": {"pattern": "^[ab]"}, "additionalProperties": {"type": "integer"},
     "properties": {"a": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"type": "array", "enum": ["x", 1]}, "b": {"type": "integer"}}},
    {"anyOf": [{"not": {"properties": {"a": {}}, "required": ["a"]}}, {"not": {"required": ["b"]}}]},
    {"$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}, "a": {"type": "integer"}}}},
     "allOf": [{"$ref": "#/$defs/t"}, {"properties": {"a": {"maximum": 3}, "k": {"required": ["b"]}}}]},
]
VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 40) | st.sampled_from(["", "x", "yy", "zzz"]),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abck"), inner,
                                                                                   max_size=3), max_leaves=6)


def valid(schema, value) -> bool:
    return not list(validator_for(schema)(schema).iter_errors(value))


@pytest.mark.parametrize("schema", REWRITTEN)
@settings(max_examples=150, deadline=None)
@given(value=VALUES)
def test_a_rewritten_schema_accepts_exactly_what_the_original_does(schema, value):
    cleaned = rewrites.clean(schema, "guidance").schema
    assert not {"dependentRequired", "dependentSchemas", "oneOf"} & set(json.dumps(cleaned).replace('"', " ").split())
    assert "propertyNames" not in cleaned or "properties" in schema  # the one form left as it is, last above
    assert valid(schema, value) == valid(cleaned, value), (schema, cleaned, value)


CHECKED = [  # (schema, the keyword checked at the end)
    ({"type": "array", "items": {"enum": ["a", "b", 1]}, "uniqueItems": True, "maxItems": 4}, "uniqueItems"),
    ({"oneOf": [{"type": "integer", "maximum": 20}, {"type": "integer", "minimum": 5, "maximum": 40}]}, "oneOf"),
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}],
      "maxProperties": 3}, "oneOf"),
    ({"type": "object", "properties": {"k": {"enum": [1, 2]}, "a": {"type": "boolean"}}, "required": ["k"],
      "if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["a"]},
      "else": {"properties": {"a": {"const": False}}}, "additionalProperties": False}, "if"),
    ({"type": "integer", "minimum": 0, "maximum": 30, "not": {"multipleOf": 3}}, "not"),
]


@pytest.fixture(scope="module")
def llm():
    return importlib.import_module("stages.07_structured").LLM("tiny", dtype="bfloat16", max_num_seqs=8)


@pytest.fixture(scope="module")
def grammars(llm):
    return importlib.import_module("stages.structured.backends").grammars_for(str(llm.folder),
                                                                               llm.config.vocab_size, (2,))


@pytest.mark.parametrize("schema, keyword", CHECKED)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), compact=st.booleans())
def test_a_checked_keyword_ends_only_an_output_that_validates(grammars, schema, keyword, seed, compact):
    """Random walks of allowed tokens, through each backend, asking for EOS as soon as it is allowed: the matcher
    ends only on a valid output; where it refuses EOS, the output is invalid and the reason names the keyword."""
    import random

    import numpy as np
    from common.sampling import StructuredOutputsParams
    for backend in ("guidance", "xgrammar"):
        grammar = grammars.build(StructuredOutputsParams(json=schema, disable_any_whitespace=compact), backend)
        assert any(keyword in c for c in grammar.checked), grammar.checked
        matcher, rng, out = grammar.matcher(), random.Random(seed), b""
        for _ in range(60):
            words = matcher.fill()
            allowed = [int(t) for t in np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
                       if t < grammars.vocab_size]
            if 2 in allowed and not matcher.accept(2):  # EOS refused by the check
                assert not valid(schema, json.loads(out)), (backend, out)
                assert f"'{keyword}' at #" in matcher.why and "checked when the output ends" in matcher.why
                break
            if matcher.is_terminated():
                assert valid(schema, json.loads(out)), (backend, out)
                break
            token = rng.choice([t for t in allowed if t != 2])
            assert matcher.accept(token)
            out += grammars.vocab[token] or b""


def test_a_checked_schema_generates_and_no_output_that_breaks_it_ends_as_a_success(llm):
    """The tiny model, sampled: every output that stops validates; one that broke the checked keyword fails alone
    with the reason (finish_reason "error"), and the other requests of the batch are unaffected."""
    from common import SamplingParams
    schema = CHECKED[0][0]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs={
        "json": schema, "disable_any_whitespace": True}) for s in range(24)]
    outs = llm.generate([[5, 6, 7]] * len(params), params)
    for out in outs:
        assert out.finish_reason in ("stop", "length", "error"), out.finish_reason
        if out.finish_reason == "stop":
            assert valid(schema, json.loads(out.text)), out.text
        if out.finish_reason == "error":
            assert "'uniqueItems' at #" in out.error, out.error
            assert not valid(schema, json.loads(out.text)), out.text
    assert any(o.finish_reason == "stop" for o in outs), [o.finish_reason for o in outs]


def test_an_eos_the_grammar_refuses_is_refused_by_the_grammar_not_the_check(grammars):
    from common.sampling import StructuredOutputsParams
    grammar = grammars.build(StructuredOutputsParams(json=CHECKED[0][0], disable_any_whitespace=True), "guidance")
    matcher = grammar.matcher()
    assert matcher.accept(grammars.vocab.index(b"[")) and not matcher.accept(2) and matcher.why is None


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_what_llguidance_refuses_is_asked_again_loosened_and_checked(grammars, seed):
    """A look-around pattern (llguidance reads none; xgrammar refuses it in a schema): served by llguidance without
    it, the pattern checked when the output ends."""
    import random

    import numpy as np
    from common.sampling import StructuredOutputsParams
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(?!ab)[abc]{1,3}$"}},
              "required": ["s"], "additionalProperties": False}
    grammar = grammars.build(StructuredOutputsParams(json=schema, disable_any_whitespace=True), "auto")
    assert grammar.backend == "guidance" and grammar.checked == ["'pattern' at #/properties/s"]
    matcher, rng, out = grammar.matcher(), random.Random(seed), b""
    for _ in range(40):
        allowed = [int(t) for t in np.flatnonzero(np.unpackbits(matcher.fill().view(np.uint8), bitorder="little"))]
        if 2 in allowed:
            ended = matcher.accept(2)
            assert ended == valid(schema, json.loads(out)), out
            assert ended or "'pattern' at #/properties/s" in matcher.why
            return
        token = rng.choice(allowed)
        assert matcher.accept(token)
        out += grammars.vocab[token] or b""

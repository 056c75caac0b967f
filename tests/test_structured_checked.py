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
rewrites = importlib.import_module("stages.structured.rewrites")

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
    assert "dependentRequired" not in json.dumps(cleaned) and "dependentSchemas" not in json.dumps(cleaned)
    assert valid(schema, value) == valid(cleaned, value), (schema, cleaned, value)

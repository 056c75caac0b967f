"""Issue 59: the rewrites that let llguidance compile JSONSchemaBench's slowest schemas fast, each exact.

Each shape is a small copy of a real schema that took seconds to compile (or that llguidance refused, leaving it to
xgrammar's seconds): Schema Store's Azure Pipelines (a long list beside branches), JReleaser (a map of S and "every
value an S"), TYPO3 (an object that requires what it forbids), AnyChart (branches that repeat a property). The
oracle is ``jsonschema`` on the original schema: the rewritten schema accepts exactly what the original does; and
where llguidance refused the original, the rewritten one compiles and its matcher takes what validates and refuses
what does not.
"""
import importlib
import json

import pytest
from hypothesis import given, settings

from common.sampling import StructuredOutputsParams
from test_structured_checked import VALUES, valid

pytest.importorskip("llguidance")
rewrites = importlib.import_module("stages.structured.schema.rewrites")

LISTED = {"type": "object", "required": ["a"],
          "properties": {"a": {"anyOf": [{"enum": list(range(10))}, {"enum": [*range(10, 19), "x"]}]}, "b": {}},
          "anyOf": [{"properties": {"a": {"minimum": 15}}, "required": ["b"]},
                    {"properties": {"a": {"maximum": 3}, "c": {"type": "string"}}}, {"properties": {"k": {}}}]}
MAP_OF_D = {"$defs": {"d": {"type": "object", "properties": {"a": {"type": "integer"}}}},  # JReleaser's shape
            "allOf": [{"type": "object", "additionalProperties": {"$ref": "#/$defs/d"},
                       "patternProperties": {"^[ab]$": {"$ref": "#/$defs/d"}}},
                      {"additionalProperties": {"$ref": "#/$defs/d"}, "type": ["object", "null"]}]}
NEVER = {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/s"}}, "a": {}},
         "$defs": {"s": {"type": "object", "properties": {"a": {}}, "additionalProperties": False,  # TYPO3's shape
                         "anyOf": [{"required": ["b"]}, {"required": ["c"]}]}}}  # if/then/else, as rewritten
REPEATED = {"$defs": {"d": {"type": "integer", "maximum": 9},  # AnyChart's shape: branches that repeat a property
                      "x": {"type": "object", "properties": {"a": {"$ref": "#/$defs/d"}, "b": {"type": "string"}},
                            "required": ["b"]}, "y": {"type": "object", "properties": {"a": {"$ref": "#/$defs/d"}}}},
            "type": "object", "properties": {"a": {"$ref": "#/$defs/d"}, "b": {"type": "string", "maxLength": 2}},
            "anyOf": [{"$ref": "#/$defs/x"}, {"$ref": "#/$defs/y"}, {"properties": {"c": {"type": "integer"}}}]}
LOOP = {"$defs": {"a": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "anyOf": [{"$ref": "#/$defs/b"}]},
                  "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}, "b": {
                      "type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
                      "anyOf": [{"$ref": "#/$defs/a"}]}}}},
        "$ref": "#/$defs/a"}  # cleaning a's branch b reaches a node whose branch is a again
SHAPES = [MAP_OF_D, NEVER, REPEATED, LISTED, LOOP,
          {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                      "additionalProperties": {"type": "string"}},
                     {"additionalProperties": {"type": ["string", "integer"]}}]},  # values differ: left as allOf
          {**LISTED, "anyOf": [*LISTED["anyOf"], {"properties": {"b": {}}, "additionalProperties": False}]}]


@pytest.fixture(scope="module")
def grammars(tiny_folder):
    return importlib.import_module("stages.structured.backends").grammars_for(str(tiny_folder), 1024, (2,))


@pytest.mark.parametrize("schema", SHAPES)
@settings(max_examples=150, deadline=None)
@given(value=VALUES)
def test_each_rewrite_accepts_exactly_what_the_original_does(schema, value):
    for backend in ("guidance", "xgrammar"):
        cleaned = rewrites.clean(schema, backend).schema
        assert valid(schema, value) == valid(cleaned, value), (schema, cleaned, value)


def test_a_property_a_branch_repeats_word_for_word_is_left_to_that_branch():
    cleaned = rewrites.clean(REPEATED, "guidance").schema
    assert cleaned["properties"] == {"a": {}, "b": {}}
    assert cleaned["anyOf"][0] == {"allOf": [{"$ref": "#/$defs/x"}, {"properties": {"b": REPEATED["properties"]["b"]}}]}
    assert rewrites.clean(REPEATED, "xgrammar").schema["properties"] == REPEATED["properties"]  # xgrammar: as it was


def test_a_map_of_d_and_every_value_a_d_merge_into_one_map():
    """S and S is S: merged, llguidance never intersects S with itself (JReleaser: 1.8 s to compile, 0.14 s)."""
    assert rewrites.clean(MAP_OF_D, "guidance").schema == {**MAP_OF_D["allOf"][0], "$defs": MAP_OF_D["$defs"]}


def test_an_object_that_requires_what_it_forbids_is_false_and_llguidance_compiles_the_rest(grammars):
    """llguidance refuses the schema whole ("unsatisfiable") though only an optional list's items are impossible;
    written false, it compiles, and the list can only be empty."""
    import llguidance as llg
    matcher = llg.LLMatcher(grammars.guidance, llg.LLMatcher.grammar_from_json_schema(NEVER), log_level=0)
    assert "nsatisfiable" in matcher.get_error()
    assert rewrites.clean(NEVER, "guidance").schema["properties"]["k"]["items"] is False
    grammar = grammars.build(StructuredOutputsParams(json=NEVER, disable_any_whitespace=True), "guidance")
    tokenizer = grammars.guidance
    for value in ({"k": []}, {"k": [{"a": 1, "b": 2}]}):
        m = grammar.matcher()
        assert all(m.accept(t) for t in tokenizer.tokenize_str(json.dumps(value))) == valid(NEVER, value), value


def test_a_long_list_beside_branches_that_narrow_it_compiles_in_llguidance_once_distributed(grammars):
    """240 names and 240 branches, each naming one (Schema Store's Azure Pipelines schema has 238): llguidance
    intersects them pair by pair and refuses the schema as written ("schema too large"); distributed, it compiles and
    enforces it (a matcher takes a branch's own name and inputs, and refuses another branch's name with them)."""
    import llguidance as llg
    names = [f"t{i}" for i in range(240)]
    inputs = [{"properties": {n: {"type": "integer"}}, "additionalProperties": False} for n in names]
    schema = {"type": "object", "properties": {"task": {"anyOf": [{"enum": [n]} for n in names]}, "inputs": {}},
              "anyOf": [{"properties": {"task": {"pattern": f"^{n}$"}, "inputs": i}} for n, i in zip(names, inputs)],
              "required": ["task"], "additionalProperties": False}
    matcher = llg.LLMatcher(grammars.guidance, llg.LLMatcher.grammar_from_json_schema(schema), log_level=0)
    assert "schema too large" in matcher.get_error()
    cleaned = rewrites.clean(schema, "guidance").schema
    assert cleaned["properties"]["task"] == {} and cleaned["anyOf"][7]["properties"]["task"] == {"enum": ["t7"]}
    grammar = grammars.build(StructuredOutputsParams(json=schema, disable_any_whitespace=True), "guidance")
    tokenizer = grammars.guidance
    for value, ok in (({"task": "t7", "inputs": {"t7": 5}}, True), ({"task": "t7", "inputs": {"t8": 5}}, False)):
        m, text = grammar.matcher(), json.dumps(value)  # the compact spelling: {"a": 1, "b": 2}
        taken = all(m.accept(t) for t in tokenizer.tokenize_str(text))
        assert taken == ok == valid(schema, value), text

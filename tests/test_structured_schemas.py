"""Stage 07 on the schemas people really send: annotations and unknown keywords accepted, drafts read, oneOf whose
branches can be told apart enforced, refusals that name keyword, place and why, both backends, a vendored sample of
JSONSchemaBench, and deep schemas through the server.

The oracle is ``jsonschema`` (an independent validator) on the original schema, under its own draft: every output
that ends by itself must validate. Tiny model (SmolLM2's byte-level vocabulary, its first 1,024 tokens).
"""
import importlib
import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema.validators import validator_for

from common import SamplingParams
from common.sampling import StructuredOutputsParams
from common.validate import InvalidParam
from workloads import examples, Server

pytest.importorskip("llguidance")
structured = importlib.import_module("stages.07_structured")
backends = importlib.import_module("stages.structured.backends")
coverage = importlib.import_module("stages.structured.coverage")
rewrites = importlib.import_module("stages.structured.schema.rewrites")

ACCEPTED = {  # kinds of schema that were refused before and constrain nothing more than their plain part
    "unknown keyword": {"type": "object", "self": {"vendor": "com.acme", "name": "e"}, "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": False},
    "x- extension": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {
        "ok": {"type": "boolean", "x-go-name": "OK"}}, "required": ["ok"], "additionalProperties": False},
    "draft-04 id": {"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://example.com/s", "type":
                    "object", "properties": {"v": {"type": "number", "minimum": 1, "exclusiveMinimum": True,
                                                   "maximum": 5}}, "required": ["v"], "additionalProperties": False},
    "unknown format": {"type": "object", "properties": {"id": {"type": "integer", "format": "int64", "minimum": 0,
                                                               "maximum": 999}},
                       "required": ["id"], "additionalProperties": False},
    "annotations": {"title": "T", "description": "d", "$comment": "c", "examples": [{"a": "x"}], "type": "object",
                    "properties": {"a": {"type": "string", "default": "z", "pattern": "^[a-z]{0,4}$",
                                         "deprecated": True}},
                    "required": ["a"], "additionalProperties": False},
    "definitions and $ref": {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {
        "c": {"enum": ["red", "blue"], "description": "a colour"}}, "type": "object",
        "properties": {"c": {"$ref": "#/definitions/c"}}, "required": ["c"], "additionalProperties": False},
    "oneOf told apart": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer"}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
         "required": ["kind", "side"], "additionalProperties": False}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}],
              "additionalProperties": False},
    "enum beside keywords": {"type": "string", "enum": ["a", "bb", "ccc", 4], "maxLength": 2},
}
REFUSED = [  # (schema, keyword, place, words of the why)
    ({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 3}}, "contains", "#", "does not enforce"),
    ({"type": "object", "properties": {"a": {"unevaluatedProperties": False}}}, "unevaluatedProperties",
     "#/properties/a", "does not enforce"),
    ({"type": "object", "properties": {"p": {"$ref": "http://example.com/p.json"}}}, "$ref", "#/properties/p",
     "nothing is downloaded"),
    ({"$dynamicRef": "#meta"}, "$dynamicRef", "#", "rewrite it as a $ref"),
]


def nested(levels: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    return schema


def valid(schema, text: str) -> bool:
    return not list(validator_for(schema)(schema).iter_errors(json.loads(text)))


@pytest.fixture(scope="module")
def llm():
    return structured.LLM("tiny", dtype="bfloat16", max_num_seqs=8)


@pytest.fixture(scope="module")
def grammars(llm):
    return backends.grammars_for(str(llm.folder), llm.config.vocab_size, (2,))


@pytest.mark.parametrize("backend", ["auto", "guidance", "xgrammar"])
def test_each_accepted_kind_is_served_and_every_output_that_ends_validates(backend):
    llm = structured.LLM("tiny", dtype="bfloat16", max_num_seqs=8, structured_outputs_config={"backend": backend})
    kinds = list(ACCEPTED)
    params = [SamplingParams(temperature=t, seed=s, max_tokens=80, structured_outputs={
        "json": ACCEPTED[k], "disable_any_whitespace": True}) for k in kinds for t, s in ((0, 0), (1.0, 3))]
    outs = llm.generate([[5, 6, 7]] * len(params), params)
    ended = [(p, o) for p, o in zip(params, outs) if o.finish_reason == "stop"]
    assert len(ended) >= len(params) // 2, [o.finish_reason for o in outs]
    for p, o in ended:
        assert valid(p.structured_outputs.schema, o.text), (p.structured_outputs.schema, o.text)


@pytest.mark.parametrize("schema, keyword, place, why", REFUSED)
def test_each_refused_kind_names_the_keyword_its_place_and_why(llm, schema, keyword, place, why):
    with pytest.raises(InvalidParam) as e:
        llm.make_samples([5], SamplingParams(max_tokens=4, structured_outputs={"json": schema}))
    assert f"'{keyword}' at {place}:" in str(e.value) and why in str(e.value), str(e.value)


def test_a_schema_deeper_than_its_limit_is_refused_by_its_own_depth(llm):
    llm.make_samples([5], SamplingParams(max_tokens=4, structured_outputs={"json": nested(40)}))
    with pytest.raises(InvalidParam, match="the schema itself is nested more than 64 subschemas deep"):
        llm.make_samples([5], SamplingParams(max_tokens=4, structured_outputs={"json": nested(70)}))


def test_the_backend_is_chosen_as_vllm_names_it(llm):
    with pytest.raises(InvalidParam, match="structured_outputs_config.backend='outlines' is invalid"):
        structured.LLM("tiny", structured_outputs_config={"backend": "outlines"})
    assert llm.engine_config.structured_outputs.backend == "auto"


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=2, max_size=4, unique=True),
       st.data())
def test_a_oneof_with_a_discriminator_never_yields_a_value_matching_two_branches(grammars, kinds, data):
    """Branches told apart by a const discriminator (their other properties drawn at random, overlapping): both
    backends serve it (xgrammar refuses a length-bounded string, by name), and every value a matcher completes
    (random walks of allowed tokens) matches exactly one."""
    props = st.fixed_dictionaries({}, optional={"x": st.just({"type": "integer"}), "y": st.just({"type": "string",
                                                                                             "maxLength": 3})})
    branches = [{"type": "object", "properties": {"kind": {"const": k}, **data.draw(props)}, "required": ["kind"]}
                for k in kinds]
    schema = {"oneOf": branches}
    for backend in ("guidance", "xgrammar"):
        try:
            grammar = grammars.build(StructuredOutputsParams(json=schema, disable_any_whitespace=True), backend)
        except InvalidParam as e:  # xgrammar leaves a length-bounded string to llguidance (schema_check.CONTROL)
            assert backend == "xgrammar" and "maxLength" in str(e) and "control character" in str(e), str(e)
            continue
        matcher = grammar.matcher()
        text = walk(grammars, matcher, data.draw(st.randoms(use_true_random=False)))
        if text is not None:
            value = json.loads(text)
            assert sum(valid(b, json.dumps(value)) for b in branches) == 1, (schema, text)


def walk(grammars, matcher, rng, steps: int = 80) -> str | None:
    """A random path through the grammar's allowed tokens, preferring EOS once allowed: its text, or None."""
    import numpy as np
    out = b""
    for _ in range(steps):
        words = matcher.fill()
        allowed = [t for t in np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
                   if t < grammars.vocab_size]
        if not allowed:
            return None
        token = 2 if 2 in allowed else int(rng.choice(allowed))
        assert matcher.accept(token)
        if matcher.is_terminated():
            return out.decode(errors="replace")  # as the tokenizer's byte-level decoder reads bytes
        out += grammars.vocab[token] or b""
    return None


def test_the_vendored_sample_compiles_or_is_refused_by_name_and_some_generate_valid(llm, grammars):
    served = []
    for name, schema in coverage.sample().items():
        try:
            grammars.build(StructuredOutputsParams(json=schema), "auto")
            served.append(schema)
        except InvalidParam as e:
            assert " at #" in str(e) or "cannot compile it" in str(e), (name, str(e))
    assert len(served) >= 30
    params = [SamplingParams(temperature=0, max_tokens=150, structured_outputs={"json": s, "disable_any_whitespace":
                                                                                 True}) for s in served]
    ended = 0
    for p, out in zip(params, llm.generate([[5, 6]] * len(params), params)):
        if out.finish_reason == "stop":
            ended += 1
            assert valid(p.structured_outputs.schema, out.text), out.text
    assert ended >= 3  # the random model runs long on most; enough end to check


def test_deep_schemas_pass_through_response_format():
    """6 and 30 levels of nested objects inside response_format (60-some levels of request body): served, and the
    output of each (forced, one key a level) validates."""
    with Server(structured.LLM("tiny", max_num_seqs=4), "tiny") as s:
        for levels in (6, 30):
            schema = nested(levels)
            body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4 * levels + 20,
                    "temperature": 0, "response_format": {"type": "json_schema",
                                                          "json_schema": {"name": "deep", "schema": schema}}}
            r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                assert valid(schema, choice["message"]["content"])


REWRITTEN = [  # schemas the cleaning rewrites: the rewritten schema must accept exactly what the original does
    {"type": "object", "additionalProperties": {"not": {}}, "properties": {"a": {"type": "integer"}}},
    {"type": "object", "not": {"required": ["b"]}},
    {"not": {"anyOf": [{"required": ["a"]}, {"required": ["c"]}]}},
    {"not": {"type": ["string", "number"]}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "dependencies": {"a": ["b"]}},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "minimum": 2, "exclusiveMinimum": True},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array", "items": [{"type": "integer"}],
     "additionalItems": {"type": "string"}},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}},
               {"properties": {"a": {"maximum": 5}}, "required": ["a"]}]},
    {"type": ["string", "integer"], "enum": ["x", "yy", 3, 30, None], "maxLength": 1, "maximum": 9},
    {"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
               {"type": "object", "properties": {"k": {"enum": [2, 3]}}, "required": ["k"]}]},
]
VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 40) | st.sampled_from(["", "x", "yy", "zzz"]),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abck"), inner,
                                                                                   max_size=3), max_leaves=6)


@pytest.mark.parametrize("schema", REWRITTEN)
@settings(max_examples=examples(150), deadline=None)
@given(value=VALUES)
def test_a_rewritten_schema_accepts_exactly_what_the_original_does(schema, value):
    """The oracle is jsonschema on both: the original under its own draft, the rewritten one under 2020-12."""
    cleaned = rewrites.clean(schema, "guidance").schema
    assert valid(schema, json.dumps(value)) == valid(cleaned, json.dumps(value)), (schema, cleaned, value)

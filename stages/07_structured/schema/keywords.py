"""The rule table: every JSON-schema keyword is enforced, ignored as an annotation, or refused, each with its source.

A schema promises two things at once: constraints (an output that breaks one is invalid) and annotations (words for
people and tools: a title, a default, an ``x-`` extension). Only a constraint can make an output invalid, so only a
constraint no backend enforces is refused; an annotation, and any keyword the specification does not define, is
ignored, as every validator ignores it (JSON Schema Core 2020-12, section 4.3.1: "unknown keywords SHOULD be
treated as annotations"). The README's table is this table.
"""
from __future__ import annotations

CORE = "JSON Schema Core 2020-12"
VALIDATION = "JSON Schema Validation 2020-12"

# Keywords that never constrain an instance: dropped before a backend sees the schema.
ANNOTATIONS = {
    "title": f"{VALIDATION} §9.1 (meta-data)", "description": f"{VALIDATION} §9.1 (meta-data)",
    "default": f"{VALIDATION} §9.2 (meta-data)", "deprecated": f"{VALIDATION} §9.3 (meta-data)",
    "readOnly": f"{VALIDATION} §9.4 (meta-data)", "writeOnly": f"{VALIDATION} §9.4 (meta-data)",
    "examples": f"{VALIDATION} §9.5 (meta-data)", "$comment": f"{CORE} §8.3 (a note for schema authors)",
    "$schema": f"{CORE} §8.1.1 (read for the draft, drafts.py)", "$id": f"{CORE} §8.2.1 (a base URI)",
    "id": "JSON Schema draft-04 Core §7.2 (draft-04's $id)", "$anchor": f"{CORE} §8.2.2",
    "$dynamicAnchor": f"{CORE} §8.2.2", "$recursiveAnchor": "JSON Schema Core 2019-09 §8.2.4.2",
    "$vocabulary": f"{CORE} §8.1.2", "contentEncoding": f"{VALIDATION} §8.3 (annotation since 2019-09)",
    "contentMediaType": f"{VALIDATION} §8.4 (annotation since 2019-09)",
    "contentSchema": f"{VALIDATION} §8.5 (annotation since 2019-09)",
}
UNKNOWN_RULE = f"{CORE} §4.3.1: an unknown keyword (x-*, self, nullable, discriminator...) is an annotation"

# Keywords that hold schemas: the walk descends into them (a keyword not listed holds a plain value).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
SCHEMA_ONE = ("items", "additionalProperties", "propertyNames", "contains", "not", "if", "then", "else",
              "additionalItems", "unevaluatedProperties", "unevaluatedItems")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")

# Constraints: enforced by at least one backend (xgrammar's own list is in schema_check.py; llguidance says for
# itself what it cannot do, since it refuses, and never skips, a keyword it does not implement).
CONSTRAINTS = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "items", "prefixItems", "minItems", "maxItems", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern", "format", "anyOf",
    "oneOf", "allOf", "$ref", "$defs", "definitions", "uniqueItems", "not", "if", "then", "else", "contains",
    "minContains", "maxContains", "dependentRequired", "dependentSchemas", "dependencies", "additionalItems",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
}

# Why each constraint no backend here enforces is refused (the rest is said by the backend that refuses).
REFUSED = {
    "$dynamicRef": "dynamic references need the schema's whole URI space; rewrite it as a $ref",
    "$recursiveRef": "recursive references (2019-09) need the schema's whole URI space; rewrite it as a $ref",
}


# Constraints a grammar cannot say in general: enforced wider, and the finished output checked (checked.py), except
# in the forms rewritten exactly (negation.py, oneof.py).
CHECKED = {
    "uniqueItems": "no item twice is not context-free; exact where at most one item or one value is possible",
    "oneOf": "a grammar says 'at least one branch', not 'not two'; exact where no value can match two branches",
    "not": "the complement of a context-free language is not one; exact for not {}, required, type",
    "if": "enforced as anyOf [then, else], the condition checked",
}


def is_annotation(key: str) -> bool:
    """True for a keyword that never constrains an instance: a listed annotation, an ``x-`` extension, or a keyword
    the specification does not define."""
    return key in ANNOTATIONS or key not in CONSTRAINTS


def rule(key: str) -> tuple[str, str]:
    """(what happens to ``key``, the source of the rule): for the README and the coverage report."""
    if key in ANNOTATIONS:
        return "ignored (annotation)", ANNOTATIONS[key]
    if key not in CONSTRAINTS:
        return "ignored (unknown keyword)", UNKNOWN_RULE
    if key in REFUSED:
        return "refused", REFUSED[key]
    if key in CHECKED:
        return "checked on the finished output where not rewritten exactly", CHECKED[key]
    return "enforced", VALIDATION

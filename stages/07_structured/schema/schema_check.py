"""What each backend enforces of a cleaned schema (rewrites.py), and a `Refused` naming the rest, by keyword and place.

xgrammar compiles a schema with a keyword it does not enforce (``uniqueItems``, ``not``, ``allOf``, ``if``) without
a word, and the output may then break the schema: "every output validates" would be false. Some pairs of enforced
keywords lose one of the two, with a log line at most: ``minLength``/``maxLength`` beside a ``pattern`` or a
``format`` (an email with ``maxLength: 40`` could run on until ``max_tokens``), a ``pattern`` beside a ``format``,
``multipleOf`` beside a range; and a length-bounded string lets raw control characters in (invalid JSON), so
``minLength``/``maxLength`` are left to llguidance. So the cleaned schema is read first and a constraint outside
this list, or such a pair, is refused by name and place (``auto`` then asks llguidance, which may enforce it). Each
enforced keyword was checked against xgrammar 0.2.9 (tests/test_structured.py). llguidance refuses (never skips) what
it does not implement, in words: `guidance_refusal` turns them into the same `Refused`.
"""
from __future__ import annotations

import re

from .keywords import CONSTRAINTS, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE
from .rewrites import Refused

ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
            "anyOf", "$ref", "$defs", "definitions", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
            "pattern", "format", "minItems", "maxItems", "minProperties", "maxProperties",
            "patternProperties", "propertyNames", "multipleOf"}
RANGE = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
CONTROL = ("xgrammar 0.2.9 lets a raw control character (a tab, a BEL) into a string whose length is bounded, so "
           "the output would not be JSON (tests/test_structured.py)")
WHY = {"minLength": CONTROL, "maxLength": CONTROL,
       "oneOf": "its branches may overlap (xgrammar would read it as anyOf, which allows a value matching two)",
       "allOf": "its branches do not merge into one schema (xgrammar would skip it)"}


def xgrammar_refusals(schema, compiler=None, ptr: str = "") -> list[Refused]:
    """What in the cleaned ``schema`` xgrammar would not enforce, each with its place; empty when all is enforced.
    A ``pattern`` is compiled alone with ``compiler`` (xgrammar ignores a look-ahead inside a schema with a warning,
    but refuses it in a regex, with its reason)."""
    if not isinstance(schema, dict):
        return []
    problems = []
    for key, value in schema.items():
        where = f"{ptr}/{key}"
        if key in CONSTRAINTS and key not in ENFORCED:
            problems.append(Refused(key, ptr, WHY.get(key, "xgrammar does not enforce it (it would be ignored, "
                                                            "and the output could break it)")))
        elif key in ("pattern", "format") and {"minLength", "maxLength"} & schema.keys():
            problems.append(Refused("minLength/maxLength", ptr, f"beside a {key} they are not enforced by xgrammar "
                                    f"(it keeps the {key} and drops the length): bound the length inside a pattern "
                                    f"instead, e.g. [a-z]{{1,40}}"))
        elif key == "format" and "pattern" in schema:
            problems.append(Refused("pattern", ptr, "beside a format it is not enforced by xgrammar (it keeps the "
                                                    "format and drops the pattern): write both as one pattern"))
        elif key == "multipleOf" and schema.get("type") != "integer":
            problems.append(Refused(key, ptr, "xgrammar enforces multipleOf on integers only"))
        elif key == "multipleOf" and (bounds := [k for k in RANGE if k in schema]):
            problems.append(Refused(key, ptr, f"beside {', '.join(bounds)} it is not enforced by xgrammar (it keeps "
                                              f"the range and drops multipleOf): use an enum of the allowed values"))
        elif key == "pattern" and compiler is not None:
            try:
                compiler.compile_regex(value)
            except (RuntimeError, ValueError) as e:
                problems.append(Refused(key, ptr, f"xgrammar cannot enforce it: {xgrammar_reason(e)}"))
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                problems += xgrammar_refusals(sub, compiler, f"{where}/{name}")
        elif key in SCHEMA_ONE or (key not in CONSTRAINTS and isinstance(value, dict)):  # or kept for a $ref
            problems += xgrammar_refusals(value, compiler, where)
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                problems += xgrammar_refusals(sub, compiler, f"{where}/{i}")
    return problems


def xgrammar_reason(e: Exception) -> str:
    """xgrammar's message without its time stamp and source line ("[16:43:36] .../json_schema_converter.cc:5082: ")."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return first.split(".cc:", 1)[-1].split(": ", 1)[-1] if ".cc:" in first else first


# llguidance says itself what it refuses. These refusals the loose cleaning (rewrites.clean) answers: the part
# it refuses is checked on the finished output instead
LOOSENED = ("circular references with sibling keys", "min/maxProperties only supported", "lookarounds not supported",
            "regex parse error")


def loosens(error: str) -> bool:
    return any(w in error for w in LOOSENED)


def guidance_refusal(error: str, schema) -> Exception:
    """llguidance's reason, as a `Refused` naming the keyword and its place where the reason names a keyword."""
    named = re.search(r'Unimplemented keys: \["([^"]+)"', error)
    key = named.group(1) if named else "oneOf" if "oneOf constraints" in error else None
    where = place_of(schema, key) if key else None
    if where is None:
        return ValueError(f"llguidance cannot enforce it: {' '.join(error.split())[:300]}")
    return Refused(key, where, "llguidance does not enforce it" + (" (its branches may overlap)" if key == "oneOf"
                                                                  else ""))


def place_of(schema, key: str) -> str | None:
    """The JSON pointer of the first schema (depth first) that has ``key``, or None."""
    stack = [(schema, "")]
    while stack:
        node, ptr = stack.pop()
        if isinstance(node, dict):
            if key in node:
                return ptr or "#"
            stack += [(v, f"{ptr}/{k}") for k, v in reversed(list(node.items()))]
        elif isinstance(node, list):
            stack += [(v, f"{ptr}/{i}") for i, v in reversed(list(enumerate(node)))]
    return None

"""``propertyNames`` in the two forms real schemas use, written as properties and patterns llguidance enforces.

llguidance 1.9.1 refuses ``propertyNames``; xgrammar enforces it but took 5-14 s to compile JSONSchemaBench's
schemas that have it. Both forms below are exact:
- names from a list (``{"enum": [...]}`` or ``const``): each listed name is a property (its schema as declared, or
  the ``additionalProperties`` schema), any other name is refused (``additionalProperties: false``);
- names matching a pattern (``{"type": "string", "pattern": P}``): a declared property whose name P does not match
  is refused (``false``), and the other properties' schema (a ``patternProperties`` of ``.*``, or
  ``additionalProperties`` where no declared name matches P) applies to names matching P, as
  ``patternProperties: {P: ...}``.
Anything else (a length bound on names, patterns beside patterns) is left for the backend to refuse or enforce.
"""
from __future__ import annotations

import re

ANY = (".*", "^.*$", ".+", "^.+$", "")


def property_names(node: dict, names) -> dict:
    """``node`` without ``propertyNames`` (``names``, its schema with any ``$ref`` followed), or as it was."""
    if not isinstance(names, dict) or not isinstance(node.get("properties", {}), dict):
        return node
    rest = {k: v for k, v in node.items() if k != "propertyNames"}
    props, others = dict(rest.get("properties", {})), rest.get("additionalProperties", True)
    patterns = rest.get("patternProperties") or {}
    listed = [names["const"]] if "const" in names else names.get("enum")
    if isinstance(listed, list) and set(names) <= {"enum", "const", "type"} and not patterns:
        if not all(isinstance(n, str) for n in listed):
            return node
        props = {n: props.get(n, others) for n in listed} | {n: False for n in props if n not in listed}
        return {**rest, "properties": props, "additionalProperties": False}
    pattern = names.get("pattern")
    if not isinstance(pattern, str) or not set(names) <= {"type", "pattern"} or \
            names.get("type") not in (None, "string"):
        return node
    if patterns:
        if len(patterns) != 1 or next(iter(patterns)) not in ANY or "additionalProperties" in rest:
            return node
        others = next(iter(patterns.values()))
    try:
        props = {n: (s if re.search(pattern, n) else False) for n, s in props.items()}
    except re.error:
        return node
    if not patterns and others not in (True, {}) and any(s is not False for s in props.values()):
        return node  # the other properties' schema would reach the declared names the pattern matches
    return {**rest, "properties": props, "patternProperties": {pattern: others}, "additionalProperties": False}

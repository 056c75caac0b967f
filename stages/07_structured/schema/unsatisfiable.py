"""An object schema no value can meet, written ``false``, and a ``$ref`` to it written ``false`` too.

TYPO3's site schema lists a route's properties (``route``, ``type``) with ``additionalProperties: false``, and then
(``if``/``then``/``else``) requires ``source`` or ``content``, which are not among them: no route is valid, so the
list of routes can only be empty. llguidance refuses such a schema whole ("required property 'content' is
unsatisfiable") even where the impossible part is optional, and xgrammar, given it instead, took 3-20 s. Written
``false`` (and a ``$ref`` to it ``false``, which llguidance takes where it does not take a reference to one), the
array's ``items`` say the same thing and llguidance compiles it at once. Exact: an object that must have a property
it may not have matches nothing.
"""
from __future__ import annotations

DATA = ("enum", "const")  # values, not schemas: a {"$ref": ...} there is data


def never_valid(node: dict) -> bool:
    """``node`` only takes objects, and each way to meet it requires a property its ``additionalProperties:
    false`` forbids (no ``patternProperties`` to allow one)."""
    if node.get("type") != "object" or node.get("additionalProperties") is not False or "patternProperties" in node:
        return False
    allowed = set(node.get("properties") or {})

    def forbidden(part) -> bool:
        return isinstance(part, dict) and bool(set(part.get("required") or []) - allowed)

    branches = node.get("anyOf")
    return forbidden(node) or (isinstance(branches, list) and bool(branches) and all(map(forbidden, branches)))


def false_refs(schema, resolve):
    """``schema`` with every ``{"$ref": r}`` whose target is ``false`` written ``false``."""
    def walk(node):
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        if set(node) == {"$ref"} and isinstance(node["$ref"], str) and resolve(schema, node["$ref"]) is False:
            return False
        return {k: v if k in DATA else walk(v) for k, v in node.items()}
    return walk(schema)

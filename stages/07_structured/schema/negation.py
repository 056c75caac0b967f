"""``not``, dependencies, ``if`` and ``uniqueItems`` written as keywords the backends enforce: exactly where a form
is known, else wider, with the finished output checked (checked.py).

Neither backend enforces ``not`` (the complement of a context-free language is not one) nor a dependency between
properties, but most uses in JSONSchemaBench have an exact positive form:
- ``not: {}`` matches nothing (``{}`` matches everything): the schema is ``false`` (103 uses, mostly "no other
  property": ``additionalProperties: {"not": {}}``);
- ``not: {"required": ["x"]}``, ``not: {"anyOf": [{"required": ["x"]}, ...]}``: an object without x, which is
  ``type: object, properties: {"x": false}`` (a non-object meets ``required`` vacuously, so the ``not`` refuses it);
- ``not: {"type": [...]}``: the other types;
- ``dependentRequired: {"a": ["b"]}`` (draft-07's ``dependencies`` with a list): a absent, or a and b both present;
  ``dependentSchemas: {"a": S}`` (``dependencies`` with a schema): a absent, or a present and S met.
The positive form joins the node through ``allOf`` and is merged like any other (allof.py). Any other ``not`` is
dropped, ``if``/``then``/``else`` becomes ``anyOf: [then, else]`` and ``uniqueItems`` of free items is dropped: wider
schemas, so rewrites.py lists each for the check of the finished output.
"""
from __future__ import annotations

TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def absent(names) -> dict:
    return {"properties": {n: False for n in names}}


def negation(schema) -> dict | bool | None:
    """A schema matching exactly what ``schema`` does not, or None where no such form is known here."""
    if schema is True or schema == {}:
        return False
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and \
            all(v is True or v == {} for v in schema["properties"].values()):
        schema = {k: v for k, v in schema.items() if k != "properties"}  # properties that constrain nothing
    if not isinstance(schema, dict) or len(schema) != 1:
        return None
    (key, value), = schema.items()
    if key == "required" and isinstance(value, list) and value:
        return {"type": "object", **absent(value)} if len(value) == 1 else \
            {"type": "object", "anyOf": [absent([n]) for n in value]}
    if key == "anyOf" and isinstance(value, list) and all(isinstance(b, dict) and set(b) == {"required"}
                                                          and isinstance(b["required"], list) for b in value):
        return {"type": "object", **absent(sorted({n for b in value for n in b["required"]}))}
    if key == "type":
        names = {value} if isinstance(value, str) else set(value) if isinstance(value, list) else None
        if names is None or ("integer" in names and "number" not in names):
            return None  # "a number that is not an integer" has no type of its own
        names |= {"integer"} if "number" in names else set()
        rest = [t for t in TYPES if t not in names]
        return {"type": rest} if rest else False
    return None


def without_not(node: dict) -> dict | bool:
    """``node`` with its ``not`` replaced by the positive form (an ``allOf`` branch), or as it was."""
    positive = negation(node["not"])
    if positive is None:
        return node
    if positive is False:
        return False
    rest = {k: v for k, v in node.items() if k != "not"}
    return {**rest, "allOf": [*rest.get("allOf", []), positive]}


def without_dependencies(node: dict) -> dict:
    """``dependentRequired``/``dependentSchemas`` as ``anyOf``: for each entry, its property absent, or present with
    what it needs (the properties it requires, the schema it brings). One entry beside no ``anyOf`` becomes the
    node's ``anyOf``; several become ``allOf`` branches, merged where they can be (allof.py), else left to
    llguidance, which enforces ``allOf``."""
    choices: list = []
    for name, needed in (node.get("dependentRequired") or {}).items():
        if not isinstance(needed, list):
            return node
        if needed:
            choices.append([absent([name]), {"required": [name, *needed]}])
    for name, sub in (node.get("dependentSchemas") or {}).items():
        if sub is False:
            choices.append([absent([name])])
        elif isinstance(sub, dict) and sub:
            present = {"required": [name], "allOf": [sub]} if "$ref" in sub or "required" in sub else \
                {**sub, "required": [name]}
            choices.append([absent([name]), present])
    rest = {k: v for k, v in node.items() if k not in ("dependentRequired", "dependentSchemas")}
    if len(choices) == 1 and "anyOf" not in rest:
        return {**rest, "anyOf": choices[0]}
    branches = [c[0] if len(c) == 1 else {"anyOf": c} for c in choices]
    return {**rest, "allOf": [*rest.get("allOf", []), *branches]} if branches else rest


def without_if(node: dict) -> tuple[dict, bool]:
    """``if``/``then``/``else`` as ``anyOf: [then, else]`` (a missing one is ``{}``), and True where that is wider
    than the schema (a value meeting ``else`` where ``if`` holds), so the finished output is checked (checked.py).
    Exact, and False, where there is no ``if`` (``then``/``else`` alone say nothing) or neither branch."""
    rest = {k: v for k, v in node.items() if k not in ("if", "then", "else")}
    then, other = node.get("then", True), node.get("else", True)
    if "if" not in node or (then in (True, {}) and other in (True, {})):
        return rest, False
    if then in (True, {}) or other in (True, {}):
        return rest, True  # one side allows everything: nothing is left to enforce
    either = {"anyOf": [then, other]}
    return ({**rest, **either} if "anyOf" not in rest else {**rest, "allOf": [*rest.get("allOf", []), either]}), True


def without_unique_items(node: dict) -> tuple[dict, bool]:
    """``uniqueItems`` dropped, and True where that is wider than the schema (then the finished output is checked,
    checked.py). Exact where it says nothing (false, at most one item) and, as ``maxItems: 1``, where every item
    must be the one listed value."""
    rest = {k: v for k, v in node.items() if k != "uniqueItems"}
    items = rest.get("items")
    if node["uniqueItems"] is not True or rest.get("maxItems", 2) <= 1:
        return rest, False
    if "prefixItems" not in rest and isinstance(items, dict) and (
            "const" in items or isinstance(items.get("enum"), list) and len(items["enum"]) <= 1):
        return {**rest, "maxItems": 1}, False
    return rest, True

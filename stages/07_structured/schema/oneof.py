"""``oneOf`` whose branches can be told apart is ``anyOf``, which both backends enforce exactly.

``oneOf`` means "exactly one branch matches". A grammar can say "at least one" (``anyOf``: the union of the
branches' languages) but not "not two", so xgrammar reads ``oneOf`` as ``anyOf`` without a word and llguidance
refuses it. Where no value can match two branches at once, the two are the same language, and the rewrite is
exact. Two branches are told apart (``apart``) when:
- their types cannot overlap (``string`` and ``object``; ``integer`` lies inside ``number``);
- their listed values (``enum``/``const``) share none, or one lists values none of which the other takes
  (checked with ``jsonschema``);
- both are objects (``type: object``: ``required`` says nothing of a string) requiring one property whose
  ``const``/``enum`` values differ (a discriminator: ``"kind": "circle"`` / ``"kind": "square"``, OpenAPI's);
- both are objects, and one requires a property the other forbids (``additionalProperties: false`` without it).
A branch that gives no type is read with its node's (``{"type": "object", "oneOf": [...]}``). Anything else (two
strings with overlapping patterns, say) stays ``oneOf``, checked on the finished output (checked.py).
"""
from __future__ import annotations

import json

NUMBER = {"integer", "number"}
MAX_REFS = 16  # a $ref chain followed this far at most


def types_of(node: dict) -> set[str] | None:
    """The JSON types a branch allows (``integer`` within ``number``), or None when it does not say."""
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        return {kind(v) for v in values} if isinstance(values, list) else None
    t = node.get("type")
    names = [t] if isinstance(t, str) else t if isinstance(t, list) else None
    if names is None:
        return None  # {"properties": ...} alone also takes a string: only a type says what it excludes
    return set(names) | ({"integer"} if "number" in names else set())


def kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "null")


def values_of(node: dict) -> list | None:
    if "const" in node:
        return [node["const"]]
    return node["enum"] if isinstance(node.get("enum"), list) else None


def apart(a: dict, b: dict, resolve) -> bool:
    """True when no value matches both branches (by the rules above)."""
    ta, tb = types_of(a), types_of(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    va, vb = values_of(a), values_of(b)
    if va is not None and vb is not None:
        return not {json.dumps(v, sort_keys=True) for v in va} & {json.dumps(v, sort_keys=True) for v in vb}
    if (va is not None or vb is not None) and "$ref" not in json.dumps(b if va is not None else a):
        from jsonschema import Draft202012Validator  # listed values, none of which the other branch takes
        other = Draft202012Validator(b if va is not None else a)
        return not any(other.is_valid(v) for v in (va if va is not None else vb))
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    if ta != {"object"} or tb != {"object"} or not (isinstance(pa, dict) and isinstance(pb, dict)):
        return False
    both = set(a.get("required") or []) & set(b.get("required") or [])
    for name in both & pa.keys() & pb.keys():
        sa, sb = follow(pa[name], resolve), follow(pb[name], resolve)
        if isinstance(sa, dict) and isinstance(sb, dict) and values_of(sa) is not None \
                and values_of(sb) is not None and apart(sa, sb, resolve):
            return True
    return forbids(a, b) or forbids(b, a)


def forbids(a: dict, b: dict) -> bool:
    """``a`` forbids a property ``b`` requires (``additionalProperties: false`` and no pattern that could take it)."""
    if a.get("additionalProperties") is not False or a.get("patternProperties"):
        return False
    return bool(set(b.get("required") or []) - set(a.get("properties") or {}))


def follow(node, resolve):
    """A branch with its ``$ref`` chain followed (a node that is only a reference says nothing by itself)."""
    for _ in range(MAX_REFS):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        node = resolve(node["$ref"])
    return None


def one_of_as_any_of(node: dict, resolve) -> dict | None:
    """``node`` with its ``oneOf`` written as ``anyOf`` when every two branches are apart; None when some two may
    overlap (the backend then decides). A ``oneOf`` beside an ``anyOf`` is left alone (one key per node)."""
    branches = [follow(b, resolve) for b in node["oneOf"]]
    if "anyOf" in node or any(not isinstance(b, dict) for b in branches):
        return None
    if "type" in node:  # every value is of the node's type: a branch that does not say is read as of it
        branches = [b if {"type", "const", "enum"} & b.keys() else {**b, "type": node["type"]} for b in branches]
    for i, a in enumerate(branches):
        for b in branches[i + 1:]:
            if not apart(a, b, resolve):
                return None
    rest = {k: v for k, v in node.items() if k != "oneOf"}
    return {**rest, "anyOf": node["oneOf"]}


def implied_type(node: dict, resolve) -> dict:
    """``type`` beside ``anyOf`` dropped where every branch already allows only those types (the ``type`` then
    removes nothing). llguidance would intersect it with each branch, and refuses to when a branch is a reference
    to a recursive definition (WashingtonPost's credits: ``items: {"type": "object", "anyOf": [{"$ref": ...}]}``)."""
    outer = types_of({"type": node["type"]})
    if outer is None or not isinstance(node.get("anyOf"), list):
        return node
    for branch in node["anyOf"]:
        inner = types_of(follow(branch, resolve)) if isinstance(follow(branch, resolve), dict) else None
        if inner is None or not inner <= outer:
            return node
    return {k: v for k, v in node.items() if k != "type"}


def exclusive_required(node: dict) -> dict | None:
    """``oneOf`` of bare ``required`` lists on an object ("exactly one of streams, source_url"): each branch's
    names present and, of every other branch, its one name absent. Exact where the node is typed ``object`` (a
    non-object meets every ``required``, so it matches them all, and ``oneOf`` refuses it) and every branch requires
    one name; None otherwise."""
    branches = node["oneOf"]
    if node.get("type") != "object" or "anyOf" in node or not all(
            isinstance(b, dict) and set(b) == {"required"} and isinstance(b["required"], list) for b in branches):
        return None
    if any(len(b["required"]) != 1 for b in branches):
        return None
    names = [b["required"][0] for b in branches]
    if len(set(names)) != len(names):
        return None  # two branches alike: no value matches exactly one of them; left to the check
    rest = {k: v for k, v in node.items() if k != "oneOf"}
    return {**rest, "anyOf": [{"required": [n], "properties": {m: False for m in names if m != n}} for n in names]}

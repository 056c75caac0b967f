"""A property with a long list of values beside an ``anyOf`` whose branches narrow it: the list filtered per branch.

Schema Store's Azure Pipelines schema says "a task is one of 238 names" (``properties.task`` an ``anyOf`` of one-name
``enum``s) and, beside it, ``anyOf`` 238 branches, each "this task name (a ``pattern``), with these inputs".
llguidance meets ``anyOf`` beside other keywords by intersecting each branch with them, and two lists intersect
pair by pair: 238 branches x 238 names passed its limit of 50,000 steps ("schema too large"), and xgrammar, given
it instead, took 10-40 s. Written out, the schema says the same thing in 238 small pieces: each branch's ``task``
is the names of the list that meet the branch's own ``task`` (one name here), a branch that does not name the
property gets the whole list, and the property beside the branches is left free (``{}``: still listed, so an
``additionalProperties`` beside it reads the same). Exact: an instance meets a branch and the list iff it meets the
branch and the list, whichever branch; checked against ``jsonschema`` in tests/test_structured_checked.py.
"""
from __future__ import annotations

import json
import threading

MIN_VALUES = 16  # shorter lists intersect cheaply; the schema is left as written


def finite_values(schema) -> list | None:
    """The values a schema allows when it lists them (``enum``, ``const``, an ``anyOf`` of such), else None."""
    if not isinstance(schema, dict) or not schema or set(schema) - {"enum", "const", "anyOf"} or len(schema) > 1:
        return None
    if "enum" in schema:
        return list(schema["enum"]) if isinstance(schema["enum"], list) else None
    if "const" in schema:
        return [schema["const"]]
    branches = [finite_values(b) for b in schema["anyOf"]] if isinstance(schema["anyOf"], list) else [None]
    return None if any(b is None for b in branches) else [v for b in branches for v in b]


def distribute_values(out: dict, walk=None) -> dict:
    """``out`` with each listed property that its ``anyOf`` branches narrow moved into the branches (see above);
    for llguidance, the properties a branch repeats word for word left to the branch (`repeated_in_branches`)."""
    for name, schema in list(out.get("properties", {}).items()):
        values = finite_values(schema)
        if values is not None and len(values) >= MIN_VALUES:
            out = into_branches(out, name, values) or out
    if walk is not None and walk.backend == "guidance" and "$ref" in json.dumps(out["properties"]):
        out = repeated_in_branches(out, lambda ref: cleaned_target(walk, ref)) or out
    return out


RESOLVING = threading.local()  # this thread's walk, its targets cleaned so far, and those being cleaned now


def cleaned_target(walk, ref: str):
    """The target of ``ref`` as the walk cleans it, cleaned once per walk; None while it is being cleaned (a
    recursive definition reached again: its branches are then left as written)."""
    if getattr(RESOLVING, "walk", None) is not walk:
        RESOLVING.walk, RESOLVING.done, RESOLVING.busy = walk, {}, set()
    if ref in RESOLVING.busy:
        return None
    if ref not in RESOLVING.done:
        RESOLVING.busy.add(ref)
        try:
            RESOLVING.done[ref] = walk.target(ref, 0)
        finally:
            RESOLVING.busy.discard(ref)
    return RESOLVING.done[ref]


def repeated_in_branches(out: dict, target) -> dict | None:
    """AnyChart's ``chart``: its properties (``background``, ``title``: references to large definitions) beside
    ``anyOf`` eleven chart types, most of which list the same properties with the same schemas. llguidance
    intersects each branch with the properties beside it, and a reference with a reference is the intersection of
    their whole trees ("schema too large"). A property a branch has word for word needs no intersection there
    (S and S is S): each branch gets, as an ``allOf`` beside it, only the properties it does not repeat, and the
    properties beside the branches are left free (``{}``, still listed). For llguidance only: xgrammar refuses an
    ``allOf`` it cannot merge."""
    props, branches = out["properties"], out["anyOf"]
    if not isinstance(branches, list) or not all(isinstance(b, dict) for b in branches):
        return None
    moved, repeated = [], 0
    for b in branches:
        t = target(b["$ref"]) if set(b) == {"$ref"} and isinstance(b["$ref"], str) else b
        if t is None:
            return None
        own = t.get("properties") if isinstance(t, dict) and isinstance(t.get("properties"), dict) else {}
        rest = {name: s for name, s in props.items() if own.get(name) != s}
        repeated += len(props) - len(rest)
        moved.append({"allOf": [b, {"properties": rest}]} if rest else b)
    if not repeated:
        return None
    return {**out, "properties": {name: {} for name in props}, "anyOf": moved}


def into_branches(out: dict, name: str, values: list) -> dict | None:
    from jsonschema import Draft202012Validator
    branches = out["anyOf"]
    if not isinstance(branches, list) or not all(isinstance(b, dict) and "$ref" not in b for b in branches):
        return None
    if not any(name in b.get("properties", {}) for b in branches):
        return None  # no branch narrows it: nothing to gain
    moved = []
    for b in branches:
        own = b.get("properties", {}).get(name)
        if own is None and ({"additionalProperties", "unevaluatedProperties"} & b.keys()):
            return None  # listing the property in this branch would change what its additionalProperties allows
        if own is not None and "$ref" in json.dumps(own):
            return None
        kept = values if own is None else [v for v in values if Draft202012Validator(own).is_valid(v)]
        if not kept:
            return None
        moved.append({**b, "properties": {**b.get("properties", {}), name: {"enum": kept}}})
    return {**out, "properties": {**out["properties"], name: {}}, "anyOf": moved}

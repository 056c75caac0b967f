"""``allOf`` merged into one schema where the merge means the same thing.

``allOf`` is an intersection: a value must match every branch. xgrammar has no intersection of grammars (it would
skip ``allOf``), so where the branches' keywords combine into one schema exactly, they are combined: ``required``
lists joined, ``properties`` merged (a property in two branches is the ``allOf`` of its two schemas, merged in turn),
``type`` sets intersected, bounds tightened (the larger minimum, the smaller maximum), equal values kept. Object
keywords that speak of the *other* properties (``additionalProperties``, ``patternProperties``, ``propertyNames``)
merge only when one part has them and every other part's properties are among that part's: then "no other
property" means the same before and after. Anything else (two different patterns, a ``not``) is left as ``allOf``.
"""
from __future__ import annotations

MINS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
MAXES = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")
OTHERS = ("additionalProperties", "patternProperties", "propertyNames", "unevaluatedProperties")
MAX_REFS = 16


class CannotMerge(Exception):
    pass


def merge_all_of(node: dict, resolve, depth: int = 0) -> dict | None:
    """``node`` with its ``allOf`` merged in, or None where a merge would change the meaning."""
    parts = [{k: v for k, v in node.items() if k != "allOf"}]
    try:
        parts += [inline(b, resolve) for b in node["allOf"]]
        return merge(parts, resolve, depth)
    except CannotMerge:
        return None


def inline(branch, resolve) -> dict:
    """A branch as keywords: a ``$ref`` alone is replaced by its target. A target that refers to itself further
    down (a recursive definition) is inlined one level, which is exact: the references inside still point to the
    definition; the merge goes at most ``MAX_REFS`` properties deep."""
    for _ in range(MAX_REFS):
        if not isinstance(branch, dict):
            raise CannotMerge
        if set(branch) != {"$ref"}:
            return branch
        branch = resolve(branch["$ref"])
    raise CannotMerge


def merge(parts: list[dict], resolve, depth: int = 0) -> dict:
    if depth > MAX_REFS:
        raise CannotMerge
    owners = [p for p in parts if any(k in p for k in OTHERS)]
    if len(owners) == 2:
        parts = [p for p in parts if p not in owners] + every_value(*owners)
        owners = [p for p in parts if any(k in p for k in OTHERS)]
    if len(owners) > 1:
        raise CannotMerge
    if owners:
        names = set(owners[0].get("properties") or {})
        if any(set(p.get("properties") or {}) - names for p in parts if p is not owners[0]):
            raise CannotMerge
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if key not in out:
                out[key] = value
            elif out[key] == value:
                continue
            elif key == "required":
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key in ("properties", "$defs", "definitions"):
                out[key] = {**out[key]}
                for name, sub in value.items():
                    out[key][name] = sub if name not in out[key] else both(out[key][name], sub, resolve, depth)
            elif key == "type":
                out[key] = types(out[key], value)
            elif key in MINS:
                out[key] = max(out[key], value)
            elif key in MAXES:
                out[key] = min(out[key], value)
            else:
                raise CannotMerge
    if "allOf" in out:
        raise CannotMerge
    return out


def every_value(a: dict, b: dict) -> list[dict]:
    """Two parts that both speak of other properties, where one says only "every property's value meets S"
    (``additionalProperties`` S, no ``properties`` or patterns) and every value schema of the other is S too
    (JReleaser's ``distributions``: a map of ``Distribution`` and "every value a ``Distribution``"): S and S is S, so
    the other part with ``additionalProperties`` S says both; the first part's other keywords (``type``) stay a part
    of their own. Else `CannotMerge` (llguidance would intersect S with itself, a copy of S's whole tree each time)."""
    for every, other in ((a, b), (b, a)):
        s = every.get("additionalProperties")
        if s is None or {"properties", "patternProperties", "propertyNames", "unevaluatedProperties"} & every.keys():
            continue
        values = [*(other.get("properties") or {}).values(), *(other.get("patternProperties") or {}).values()]
        if all(v == s for v in values) and other.get("additionalProperties", s) == s and \
                not {"propertyNames", "unevaluatedProperties"} & other.keys():
            rest = {k: v for k, v in every.items() if k != "additionalProperties"}
            return [{**other, "additionalProperties": s}, rest]
    raise CannotMerge


def both(a, b, resolve, depth: int = 0):
    """Two schemas for one property: their merge, or their ``allOf`` left for the backend."""
    if a is True or b is True:
        return b if a is True else a
    if a is False or b is False:
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        merged = merge_all_of({"allOf": [a, b]}, resolve, depth + 1)
        return merged if merged is not None else {"allOf": [a, b]}
    raise CannotMerge


def types(a, b):
    sa = {a} if isinstance(a, str) else set(a)
    sb = {b} if isinstance(b, str) else set(b)
    sa |= {"integer"} if "number" in sa else set()
    sb |= {"integer"} if "number" in sb else set()
    common = sa & sb
    if not common:
        raise CannotMerge
    return sorted(common) if len(common) > 1 else next(iter(common))


def pattern_overlap(node: dict, checked: list | None = None, ptr: str = "") -> dict:
    """A property whose name a ``patternProperties`` pattern also matches must meet both schemas; where every such
    pattern's schema is the property's own, meeting it once is the same (A and A is A): the property's schema
    becomes ``true`` and the pattern's applies. llguidance would otherwise intersect the two, and refuses to when
    they reach a recursive definition (WashingtonPost's ``promo_items``). With ``checked`` (a list: the loose
    cleaning, asked for when llguidance refused), a property whose schema differs is given the pattern's alone,
    and its own is left to the check of the finished output (checked.py), listed there."""
    import re
    props, patterns = node.get("properties"), node.get("patternProperties")
    if not (isinstance(props, dict) and isinstance(patterns, dict)):
        return node
    same = {}
    for name, sub in props.items():
        try:
            matching = [s for p, s in patterns.items() if re.search(p, name)]
        except (re.error, TypeError):
            return node
        same[name] = True if matching and (checked is not None or all(s == sub for s in matching)) else sub
        if matching and same[name] is True and sub is not True and checked is not None:
            checked.append(f"'properties' at #{ptr}/properties/{name} (beside patternProperties)")
    return {**node, "properties": same}

"""A schema as a backend should see it: annotations dropped, the draft's spelling made 2020-12's, and a few keywords
rewritten into ones the backends enforce exactly, or a `Refused` that names the keyword, its place and why.

`clean` walks the schema once (subschema by subschema, so ``properties`` is read as names, never as keywords):
- annotations and unknown keywords go (keywords.py), an unenforced ``format`` too (formats.py); drafts (drafts.py);
- ``enum``/``const`` beside other keywords become the listed values that meet them (``jsonschema`` checks them);
  a long list beside ``anyOf`` branches is filtered into each (distribute.py); an object nothing meets is ``false``;
- ``allOf`` is merged into its parent where the merge is exact (allof.py), ``oneOf`` becomes ``anyOf`` where no
  value can match two branches (oneof.py); dependencies, ``not``, ``if`` and ``uniqueItems`` (negation.py);
- what a grammar cannot say (``oneOf`` whose branches may overlap, ``uniqueItems``, ``not``, ``if``) is given to
  the backend wider and listed in ``Cleaned.checked``: the finished output is validated (checked.py);
- a ``$ref`` into a place the walk dropped (``#/components/...`` under an unknown keyword) is kept there, cleaned.
A schema nested deeper than ``MAX_DEPTH`` subschemas is refused by its own depth (the server's body guard is wider).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import unquote

from . import formats
from .allof import merge_all_of, pattern_overlap
from .distribute import distribute_values
from .drafts import draft_of, to_2020
from .keywords import REFUSED, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE, is_annotation
from .negation import without_dependencies, without_if, without_not, without_unique_items
from .oneof import exclusive_required, follow, implied_type, one_of_as_any_of
from .propnames import property_names
from .unsatisfiable import false_refs, never_valid

MAX_DEPTH = 64  # subschemas inside subschemas; JSONSchemaBench's deepest needs 30-some


class Refused(Exception):
    """A keyword no backend in use enforces: its name, its place (a JSON pointer, ``#/properties/tags``) and why."""

    def __init__(self, keyword: str, pointer: str, why: str):
        pointer = pointer if pointer.startswith("#") else "#" + pointer
        super().__init__(f"{keyword!r} at {pointer}: {why}" if keyword else f"{pointer}: {why}")
        self.keyword, self.pointer, self.why = keyword, pointer, why


@dataclass
class Cleaned:
    schema: dict
    ignored: Counter = field(default_factory=Counter)  # keyword -> times dropped as an annotation
    rewritten: Counter = field(default_factory=Counter)  # rewrite -> times done (enum filtered, oneOf, allOf)
    checked: list[str] = field(default_factory=list)  # keywords left to the check of the finished output (checked.py)


def resolve(root, ref: str):
    """The node a local ``$ref`` (``#/$defs/a``, JSON pointer escapes and %-escapes read) points to, or None."""
    node = root
    for part in [p for p in ref[1:].split("/")[1:]] if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


class Walk:
    def __init__(self, root, backend: str, loose: bool = False):
        self.root, self.backend, self.draft, self.loose = root, backend, draft_of(root), loose
        self.out = Cleaned({})
        self.refs: set[str] = set()

    def node(self, node, ptr: str, depth: int):
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            raise Refused("", ptr, f"a {type(node).__name__} where a schema (an object or a boolean) belongs")
        if depth > MAX_DEPTH:
            raise Refused("", ptr, f"the schema itself is nested more than {MAX_DEPTH} subschemas deep (the "
                                   f"schema's own depth, not the request's)")
        out = {}
        for key, value in to_2020(node, self.draft).items():
            where = f"{ptr}/{key.replace('~', '~0').replace('/', '~1')}"
            if is_annotation(key):
                self.out.ignored["x-*" if key.startswith("x-") else key] += 1
            elif key == "format" and not formats.keeps(value, self.backend):
                self.out.ignored[f"format {value}"] += 1
            elif key in REFUSED:
                raise Refused(key, ptr, REFUSED[key])
            elif key == "$ref":
                if not isinstance(value, str) or not (value == "#" or value.startswith("#/")):
                    raise Refused(key, ptr, f"{json.dumps(value)[:80]} is not a place in this schema: only local "
                                            f"references (#/...) are read; nothing is downloaded")
                self.refs.add(value)
                out[key] = value
            elif key in SCHEMA_MAPS:
                if not isinstance(value, dict):
                    raise Refused(key, ptr, "must map names to schemas")
                out[key] = {n: self.node(s, f"{where}/{n.replace('~', '~0').replace('/', '~1')}", depth + 1)
                            for n, s in value.items()}
            elif key in SCHEMA_ONE:
                out[key] = self.node(value, where, depth + 1)
            elif key in SCHEMA_LISTS:
                if not isinstance(value, list) or not value:
                    raise Refused(key, ptr, "must be a non-empty list of schemas")
                out[key] = [self.node(s, f"{where}/{i}", depth + 1) for i, s in enumerate(value)]
            elif key == "dependencies" and isinstance(value, dict):  # draft-07's, split as 2019-09 did
                for name, dep in value.items():
                    kind = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
                    out.setdefault(kind, {})[name] = dep if isinstance(dep, list) else self.node(dep, where, depth + 1)
            else:
                out[key] = value
        return self.rewrite(out, ptr, depth)

    def rewrite(self, out: dict, ptr: str, depth: int) -> dict | bool:
        if "enum" in out or "const" in out:
            out = self.values_only(out, ptr)
            if out is False:
                return False
        if "not" in out:
            out = without_not(out)
            if out is False:
                self.out.rewritten["not as false"] += 1
                return False
            out = self.checked(out, ("not",), ptr)
        if {"if", "then", "else"} & out.keys():
            out, wider = without_if(out)
            self.out.checked += [f"'if' at #{ptr}"] if wider else []
        if self.loose and ({"minProperties", "maxProperties"} & out.keys()):  # llguidance: only all required
            out = self.checked(out, ("minProperties", "maxProperties"), ptr)
        if self.loose and any(a in str(out.get("pattern")) for a in ("(?=", "(?!", "(?<=", "(?<!")):  # look-around
            out = self.checked(out, ("pattern",), ptr)
        if "dependentRequired" in out or "dependentSchemas" in out:
            out = without_dependencies(out)
            self.out.rewritten["dependencies as anyOf"] += 1
        if "propertyNames" in out:
            out = property_names(out, follow(out["propertyNames"], lambda ref: self.target(ref, depth)))
        if "patternProperties" in out and "properties" in out:
            out = pattern_overlap(out, self.out.checked if self.loose else None, ptr)
        if "allOf" in out:
            merged = merge_all_of(out, lambda ref: self.target(ref, depth))
            if merged is not None:
                self.out.rewritten["allOf merged"] += 1
                out = merged
        if "oneOf" in out:
            rewritten = one_of_as_any_of(out, lambda ref: resolve(self.root, ref)) or exclusive_required(out)
            if rewritten is not None:
                self.out.rewritten["oneOf as anyOf"] += 1
                out = rewritten
            elif "anyOf" not in out:  # branches that may overlap: "at least one" enforced, "not two" checked
                self.out.checked.append(f"'oneOf' at #{ptr}")
                out = {**{k: v for k, v in out.items() if k != "oneOf"}, "anyOf": out["oneOf"]}
        if "uniqueItems" in out:
            out, wider = without_unique_items(out)
            self.out.checked += [f"'uniqueItems' at #{ptr}"] if wider else []
        if "anyOf" in out and "type" in out:
            out = implied_type(out, lambda ref: resolve(self.root, ref))
        return False if ptr and never_valid(out) else \
            distribute_values(out, self) if "anyOf" in out and "properties" in out else out

    def checked(self, out: dict, keys: tuple, ptr: str) -> dict:
        """``out`` without ``keys``, each listed for the check of the finished output (checked.py)."""
        self.out.checked += [f"'{k}' at #{ptr}" for k in keys if k in out]
        return {k: v for k, v in out.items() if k not in keys}

    def target(self, ref: str, depth: int):
        """What a ``$ref`` points to, cleaned (an ``allOf`` branch inlined is given to the backend as it is)."""
        node = resolve(self.root, ref)
        return None if node is None else self.node(node, ref[1:], depth + 1)

    def values_only(self, out: dict, ptr: str) -> dict | bool:
        """``enum``/``const`` with keywords beside them: the listed values that meet those keywords, alone; ``false``
        below the root where none does (a property that can never be present), refused at the root."""
        values = out["enum"] if "enum" in out else [out["const"]]
        if not isinstance(values, list):
            raise Refused("enum", ptr, "must be a list of values")
        beside = {k: v for k, v in out.items() if k not in ("enum", "const", "$defs", "definitions")}
        if not beside:
            return out
        if "$ref" in json.dumps(beside):
            return out  # resolved by the backend; enum beside a $ref is left to it
        from jsonschema import Draft202012Validator
        check = Draft202012Validator(beside)
        kept = [v for v in values if check.is_valid(v)]
        if not kept and ptr and not {"$defs", "definitions"} & out.keys():  # an optional place: never present
            self.out.rewritten["enum with no value: false"] += 1
            return False
        if not kept:
            raise Refused("enum" if "enum" in out else "const", ptr, "no listed value meets the keywords beside it "
                          f"({', '.join(sorted(beside))}): the schema allows nothing here")
        self.out.rewritten["enum filtered"] += 1
        return {"enum": kept, **{k: out[k] for k in ("$defs", "definitions") if k in out}}

    def keep_referenced(self) -> None:
        """A ``$ref`` into a place the walk dropped (under an unknown keyword): that place, cleaned, put back."""
        done: set[str] = set()
        while pending := sorted(self.refs - done):
            for ref in pending:
                done.add(ref)
                if resolve(self.out.schema, ref) is not None:
                    continue
                target = resolve(self.root, ref)
                if target is None:
                    raise Refused("$ref", "#", f"{ref} points to nothing in this schema")
                parts = [unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]
                cleaned, place = self.node(target, ref[1:], 1), self.out.schema
                for part in parts[:-1]:
                    place = place.setdefault(part, {}) if isinstance(place, dict) else None
                    if not isinstance(place, dict):
                        raise Refused("$ref", "#", f"{ref} points inside a keyword this draft's rewrite moved")
                place[parts[-1]] = cleaned


def clean(schema, backend: str, loose: bool = False) -> Cleaned:
    """``schema`` as ``backend`` ("xgrammar" or "guidance") is given it, with what was dropped and rewritten;
    ``loose``: a property a pattern also matches is given the pattern's schema alone, its own checked at the end."""
    walk = Walk(schema, backend, loose)
    walk.out.schema = walk.node(schema, "", 1)
    walk.keep_referenced()
    walk.out.schema = false_refs(walk.out.schema, resolve)  # unsatisfiable.py: llguidance takes false, not a $ref
    return walk.out


def depth(value) -> int:
    """The JSON nesting of ``value`` (1 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        stack += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())]
    return deepest

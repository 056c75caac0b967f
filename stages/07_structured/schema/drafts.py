"""The ``$schema`` draft, and the few keywords whose meaning changed between drafts, written in 2020-12's terms.

Real schemas declare draft-04 (most of JSONSchemaBench), -06, -07, 2019-09 or 2020-12, and both backends read
2020-12. Where a draft spells a constraint otherwise, the node is rewritten into its 2020-12 spelling, so the
backend enforces what the schema's own draft means (the oracle in the tests and in ``coverage`` is ``jsonschema``
validating against the original schema under its declared draft):
- draft-04 ``exclusiveMinimum: true`` beside ``minimum`` (a boolean then) is 2020-12's ``exclusiveMinimum: n``;
- ``items: [...]`` (a list, up to 2019-09) is ``prefixItems``, and ``additionalItems`` then is ``items``;
- up to draft-07 a ``$ref`` ignores its siblings ("All other properties in a "$ref" object MUST be ignored",
  draft-07 Core §8.3); from 2019-09 they apply beside it;
- draft-04's ``id`` and later ``$id`` are base URIs (annotations here: only ``#/...`` references are read), and
  ``definitions`` is ``$defs`` by another name (a ``$ref`` says which one it points into).
"""
from __future__ import annotations

DRAFTS = {"draft-03": 3, "draft-04": 4, "draft-06": 6, "draft-07": 7, "2019-09": 2019, "2020-12": 2020}
DEFAULT = 2020  # no $schema: read as the newest draft, as xgrammar and llguidance do


def draft_of(schema) -> int:
    """The draft ``$schema`` names (4, 6, 7, 2019, 2020); the newest when it names none or one not listed."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str):
        for name, number in DRAFTS.items():
            if name in uri:
                return number
    return DEFAULT


def to_2020(node: dict, draft: int) -> dict:
    """``node`` (one schema object, not its subschemas) in 2020-12's spelling of ``draft``'s meaning."""
    node = dict(node)
    if draft <= 7 and "$ref" in node:
        return {"$ref": node["$ref"], **{k: node[k] for k in ("$defs", "definitions") if k in node}}
    if draft <= 4:
        for bound in ("Minimum", "Maximum"):
            flag = node.get("exclusive" + bound)
            if isinstance(flag, bool):
                del node["exclusive" + bound]
                if flag and bound.lower() in node:
                    node["exclusive" + bound] = node.pop(bound.lower())
    if isinstance(node.get("items"), list):  # the tuple form, up to 2019-09
        node["prefixItems"] = node.pop("items")
        if "additionalItems" in node:
            node["items"] = node.pop("additionalItems")
    else:
        node.pop("additionalItems", None)  # without a tuple it constrains nothing
    return node

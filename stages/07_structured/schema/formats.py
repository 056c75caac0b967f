"""``format``: which values each backend enforces, and why any other value is an annotation.

Since draft 2019-09 ``format`` is an annotation unless the schema declares the format-assertion vocabulary (JSON
Schema Validation 2020-12, section 7.2); before that, draft-04 to draft-07 let a validator check it or not ("MAY",
draft-07 Validation section 7.2), and Python's ``jsonschema`` checks none by default. So a format a backend enforces
is enforced, and any other (``int32``, ``topic``, a typo) is dropped as an annotation: it can never make an output
invalid. Each enforced list was read from its backend (xgrammar 0.2.9's JSON-schema converter; llguidance 1.9.1's
``format`` table) and checked by compiling it (tests/test_structured_schemas.py).
"""
from __future__ import annotations

XGRAMMAR = frozenset({"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
                      "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"})
GUIDANCE = frozenset({"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri"})
RULE = "JSON Schema Validation 2020-12 §7.2: format is an annotation unless format-assertion is declared"


def enforced(backend: str) -> frozenset[str]:
    return XGRAMMAR if backend == "xgrammar" else GUIDANCE


def keeps(value, backend: str) -> bool:
    """True when ``backend`` enforces this format (it stays in the schema); False: dropped as an annotation."""
    return isinstance(value, str) and value in enforced(backend)

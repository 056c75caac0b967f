"""A request body's bytes before any field is read: JSON syntax (no NaN or Infinity), UTF-8 text with no lone
surrogate in any key or value, and a bounded nesting depth, each refused with a 400 that says which. Then
pydantic's first validation error as OpenAI's error object, its ``param`` the field's path.
"""
from __future__ import annotations

import json

from pydantic import ValidationError

from common.validate import InvalidParam, check_text, clip

from .errors import APIError

# A chat body is 5 levels deep (messages -> message -> content -> part -> text), but a JSON schema in
# response_format carries its own nesting: two levels per nested object (properties -> name), 60-some for the
# 30-level schemas of JSONSchemaBench's deepest splits. Stage 07 bounds a schema by its own depth (64 subschemas,
# stages/07_structured/schema/rewrites.py); this guard only keeps a parser's stack bounded.
MAX_DEPTH = 256


def parse_json(raw: bytes):
    try:
        body = json.loads(raw, parse_constant=reject_constant)
    except RecursionError:
        raise APIError(400, f"the request body is nested too deeply (the limit is {MAX_DEPTH} levels)") from None
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not UTF-8 text") from None
    except ValueError as e:  # JSONDecodeError, NaN or Infinity, an integer of more than 4,300 digits
        raise APIError(400, f"the request body is not valid JSON: {clip(str(e), 160)}") from None
    check_tree(body)
    return body


def reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def check_tree(body) -> None:
    """No string (key or value) may hold a lone surrogate; no nesting deeper than MAX_DEPTH."""
    stack = [(body, 1, None)]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"the request body is nested more than {MAX_DEPTH} levels deep", field)
        try:
            if isinstance(value, str):
                check_text(field or "body", value)
            elif isinstance(value, dict):
                for key, item in value.items():
                    check_text(field or "a key", key)
                    stack.append((item, depth + 1, field or key))
            elif isinstance(value, list):
                stack.extend((item, depth + 1, field) for item in value)
        except InvalidParam as e:
            raise APIError(400, str(e), e.param if field else None) from None


def from_validation_error(e: ValidationError) -> APIError:
    """pydantic's first error -> an OpenAI error whose `param` is the field's path, e.g. messages[0].role."""
    err = e.errors(include_url=False, include_input=False)[0]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    if err["type"] == "extra_forbidden":
        return APIError(400, f"unrecognized request argument: {clip(param, 60)}", param[:60])
    message = err["msg"].removeprefix("Value error, ")
    return APIError(400, f"{param}: {message}" if param else message, param or None)

"""The JSON-schema keywords xgrammar enforces, and a refusal for every other one.

xgrammar compiles a schema with a keyword it does not enforce (``uniqueItems``, ``not``, ``allOf``, ``if``, an
unknown ``format``) without a word, and the output may then break the schema: "every output validates" would be
false. Some pairs of enforced keywords lose one of the two, with a log line at most: ``minLength``/``maxLength`` beside
a ``pattern`` or a ``format`` (an email with ``maxLength: 40`` could run on until ``max_tokens``), a ``pattern``
beside a ``format``, ``multipleOf`` beside a range, and everything beside ``enum``/``const`` but the listed values
(of any type). So a schema is read first and a keyword outside this list, or such a pair, is refused by name and
place, the way vLLM refuses the features xgrammar lacks.
Each enforced keyword was checked against xgrammar 0.2.9 (tests/test_structured.py).
"""
from __future__ import annotations

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly"}
ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
            "anyOf", "$ref", "$defs", "definitions", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
            "minLength", "maxLength", "pattern", "format", "minItems", "maxItems", "minProperties", "maxProperties",
            "patternProperties", "propertyNames", "multipleOf"}
FORMATS = {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
           "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"}
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")  # name -> schema
SUBSCHEMAS = ("items", "additionalProperties", "propertyNames")  # a schema (or a bool)
SUBSCHEMA_LISTS = ("anyOf", "prefixItems")
RANGE = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
BESIDE_VALUES = ENFORCED - {"type", "enum", "const", "$defs", "definitions"}  # dropped beside enum/const
JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "null": (type(None),),
              "object": (dict,), "array": (list,)}


def unsupported_keywords(schema, compiler=None, path: str = "$") -> list[str]:
    """What in ``schema`` xgrammar would not enforce, each with its place (``$.properties.tags``); empty when all is
    enforced. A ``pattern`` is compiled alone with ``compiler`` (xgrammar ignores a look-ahead inside a schema with a
    warning, but refuses it in a regex, with its reason)."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return [f"{path} is {type(schema).__name__}, not a schema (an object)"]
    problems = []
    for key, value in schema.items():
        where = f"{path}.{key}"
        if key not in ENFORCED | ANNOTATIONS:
            problems.append(f"the keyword {key!r} at {path} is not enforced by xgrammar (it would be ignored, and the "
                            f"output could break it): remove it, or check it after parsing")
        elif key == "format" and value not in FORMATS:
            problems.append(f"the format {value!r} at {path} is not enforced by xgrammar; it enforces "
                            f"{', '.join(sorted(FORMATS))}")
        elif key in ("pattern", "format") and {"minLength", "maxLength"} & schema.keys():
            problems.append(f"minLength/maxLength at {path} beside a {key} are not enforced by xgrammar (it keeps the "
                            f"{key} and drops the length): bound the length inside a pattern instead, e.g. "
                            f"[a-z]{{1,40}}")
        elif key == "format" and "pattern" in schema:
            problems.append(f"the pattern at {path} beside a format is not enforced by xgrammar (it keeps the format "
                            f"and drops the pattern): write both as one pattern")
        elif key in ("enum", "const") and (others := sorted(BESIDE_VALUES & schema.keys())):
            problems.append(f"{', '.join(others)} at {path} beside {key} are not enforced by xgrammar (it allows "
                            f"exactly the listed values): list only values that meet them, and drop them")
        elif key in ("enum", "const") and (wrong := mistyped(value if key == "enum" else [value], schema)):
            problems.append(f"{key} at {path} lists {wrong[0]!r}, which is not of type {schema['type']!r}; xgrammar "
                            f"would allow it all the same")
        elif key == "multipleOf" and schema.get("type") != "integer":
            problems.append(f"multipleOf at {path} is enforced by xgrammar on integers only")
        elif key == "multipleOf" and (bounds := [k for k in RANGE if k in schema]):
            problems.append(f"multipleOf at {path} beside {', '.join(bounds)} is not enforced by xgrammar (it keeps "
                            f"the range and drops multipleOf): use an enum of the allowed values, or drop one")
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            problems.append(f"the $ref {value!r} at {path} is not in this schema: only local references (#/...) are "
                            f"read; nothing is downloaded")
        elif key == "pattern" and compiler is not None:
            try:
                compiler.compile_regex(value)
            except (RuntimeError, ValueError) as e:
                problems.append(f"the pattern at {path} cannot be enforced: {xgrammar_reason(e)}")
        elif key in SUBSCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                problems += unsupported_keywords(sub, compiler, f"{where}.{name}")
        elif key in SUBSCHEMAS:
            problems += unsupported_keywords(value, compiler, where)
        elif key in SUBSCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                problems += unsupported_keywords(sub, compiler, f"{where}[{i}]")
    return problems


def mistyped(values, schema: dict) -> list:
    """The values (of an enum or a const) that are not of the schema's ``type`` (a name or a list of names)."""
    if "type" not in schema or not isinstance(values, list):
        return []
    names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    kinds = tuple(t for n in names for t in JSON_TYPES.get(n, (object,)))
    return [v for v in values if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds)]


def xgrammar_reason(e: Exception) -> str:
    """xgrammar's message without its time stamp and source line ("[16:43:36] .../json_schema_converter.cc:5082: ")."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return first.split(".cc:", 1)[-1].split(": ", 1)[-1] if ".cc:" in first else first

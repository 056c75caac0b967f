"""The schema suite: 30 constrained requests, each a chat prompt and its ``structured_outputs``, shown by the stage's
demo and checked by its tests (every output must parse and match its schema, pattern or choice)."""
from __future__ import annotations

import json
import re

S, I, N = {"type": "string", "maxLength": 40}, {"type": "integer"}, {"type": "number"}
# Every string is bounded, so every answer can end within the tests' max_tokens on any machine. Not "format": "email":
# xgrammar drops a maxLength beside a format, and a sampled answer once filled 200 tokens with one address.
EMAIL = {"type": "string", "pattern": "^[a-z0-9._]{1,24}@[a-z0-9-]{1,24}\\.[a-z]{2,6}$"}


def obj(required: dict, optional: dict | None = None) -> dict:
    return {"type": "object", "properties": {**required, **(optional or {})}, "required": list(required),
            "additionalProperties": False}


SCHEMAS = {
    "person": obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}}),
    "city": obj({"city": S, "country": S, "population": {"type": "integer", "minimum": 0}}),
    "book": obj({"title": S, "author": S, "year": {"type": "integer", "minimum": 1400, "maximum": 2030}}),
    "colors": obj({"colors": {"type": "array", "items": S, "minItems": 2, "maxItems": 4}}),
    "weather": obj({"city": S, "temperature_c": {"type": "number", "minimum": -60, "maximum": 60},
                    "sky": {"enum": ["sunny", "cloudy", "rainy", "snowy"]}}),
    "sentiment": obj({"sentiment": {"enum": ["positive", "negative", "neutral"]},
                      "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
    "address": obj({"street": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "city": S}),
    "nested": obj({"user": obj({"name": S, "email": EMAIL}),
                   "active": {"type": "boolean"}}),
    "optional_keys": obj({"name": S}, {"nickname": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "recipe": obj({"dish": S, "ingredients": {"type": "array", "items": S, "minItems": 1, "maxItems": 5},
                   "minutes": {"type": "integer", "minimum": 1, "maximum": 600}}),
    "point": obj({"x": {"type": "number", "minimum": -100, "maximum": 100},
                  "y": {"type": "number", "minimum": -100, "maximum": 100}}),
    "scores": obj({"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                              "minItems": 3, "maxItems": 3}}),
    "event": obj({"name": S, "date": {"type": "string", "format": "date"}}),
    "planet": obj({"planet": {"enum": ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus",
                                       "Neptune"]}, "moons": {"type": "integer", "minimum": 0, "maximum": 200}}),
    "product": obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "price": {"type": "number",
                    "minimum": 0, "maximum": 10000}, "in_stock": {"type": "boolean"}}),
    "team": obj({"team": S, "members": {"type": "array", "maxItems": 3, "items": obj({"name": S, "role": S})}}),
    "translation": obj({"english": S, "french": S}),
    "matrix": obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}}),
    "anyof": obj({"answer": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, S]}}),
    "constant": obj({"version": {"const": "1.0"}, "name": S}),
    "list_of_tasks": obj({"tasks": {"type": "array", "minItems": 1, "maxItems": 3, "items": obj(
        {"title": S, "done": {"type": "boolean"}})}}),
    "defs": {"$defs": {"pet": obj({"name": S, "species": {"enum": ["cat", "dog", "bird"]}})},
             **obj({"owner": S, "pet": {"$ref": "#/$defs/pet"}})},
}
PROMPTS = {
    "person": "Describe Ada Lovelace as JSON with her name and the age she reached.",
    "city": "Give the capital of Japan as JSON: city, country, population.",
    "book": "Give a famous novel as JSON: title, author and year.",
    "colors": "List three colors of a rainbow as JSON.",
    "weather": "Describe today's weather in London as JSON.",
    "sentiment": "Classify the sentiment of 'I love this phone!' as JSON.",
    "address": "Write a US mailing address as JSON with a 5-digit zip code.",
    "nested": "Give a user record as JSON: the user's name and email, and whether the account is active.",
    "optional_keys": "Describe a cat named Tom as JSON.",
    "recipe": "Give a simple pancake recipe as JSON.",
    "point": "Give a point in the plane as JSON with x and y.",
    "scores": "Give three judges' scores from 0 to 10 as JSON.",
    "event": "Give the first Moon landing as JSON: its name and its date.",
    "planet": "Which planet is the largest? Answer as JSON with its number of moons.",
    "product": "Describe a product in a shop as JSON with a SKU like ABC-1234.",
    "team": "Describe a small software team as JSON.",
    "translation": "Translate 'good morning' into French, as JSON.",
    "matrix": "Give a 2x2 matrix of small integers as JSON.",
    "anyof": "What is 6 times 7? Answer as JSON.",
    "constant": "Give a config file as JSON with version 1.0 and a name.",
    "list_of_tasks": "Give a to-do list as JSON.",
    "defs": "Describe a person and their pet as JSON.",
}
OTHERS = [  # (name, prompt, structured_outputs)
    ("json_object", "Give the Eiffel Tower's name and height in meters as a JSON object with two keys, \"name\" and "
                    "\"height\".", {"json_object": True}),
    ("yes_no", "Is the sky blue? Answer yes or no.", {"choice": ["yes", "no"]}),
    ("capital_choice", "What is the capital of France?", {"choice": ["Paris", "London", "Berlin", "Madrid"]}),
    ("sentiment_choice", "Sentiment of 'This movie was terrible'?", {"choice": ["positive", "negative", "neutral"]}),
    ("phone", "Write a US phone number.", {"regex": r"\(\d{3}\) \d{3}-\d{4}"}),
    ("date_regex", "When did World War II end? Give the date as YYYY-MM-DD.", {"regex": r"\d{4}-\d{2}-\d{2}"}),
    ("email_regex", "Write an email address for John at example.com.", {"regex": r"[a-z]{1,12}@example\.com"}),
    ("grammar", "Write a short arithmetic expression.",
     {"grammar": 'root ::= term (("+" | "-") term){0,3}\nterm ::= [1-9] [0-9]?'}),
]
CASES = [(name, PROMPTS[name], {"json": schema}) for name, schema in SCHEMAS.items()] + OTHERS
GRAMMAR_CHECK = {"grammar": r"[1-9][0-9]?([+-][1-9][0-9]?){0,3}"}  # the grammar above, as a pattern


def check(output: str, structured_outputs: dict) -> str | None:
    """Why ``output`` breaks its constraint, or None when it parses and matches: the schema checked by jsonschema
    (an independent validator, when installed), a pattern by Python's re, a choice by membership."""
    kind, spec = next(iter(structured_outputs.items()))
    if kind in ("json", "json_object"):
        try:
            value = json.loads(output)
        except ValueError as e:
            return f"not JSON: {e}"
        schema = spec if kind == "json" else {"type": "object"}
        try:
            import jsonschema
        except ImportError:
            return None if kind == "json" or isinstance(value, dict) else "not an object"
        errors = list(jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
                      .iter_errors(value))
        return f"breaks the schema: {errors[0].message}" if errors else None
    if kind == "choice":
        return None if output in spec else f"not one of {spec}"
    pattern = GRAMMAR_CHECK["grammar"] if kind == "grammar" else spec
    return None if re.fullmatch(pattern, output, re.DOTALL) else f"does not match {pattern!r}"

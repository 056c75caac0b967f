"""Argument checks shared by the Python API and the server: a wrong value is a ValueError naming its field."""
from __future__ import annotations


class InvalidParam(ValueError):
    """A ValueError that says which argument is wrong (`param`: the server's error field of that name)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def clip(value, limit: int = 40) -> str:
    """``repr(value)`` cut to a short prefix: an error message never echoes a whole user input back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def check_int(name: str, value, low: int | None = None, high: int | None = None, prefix: str = "") -> None:
    """``value`` must be an int (a bool is not one) in [low, high]."""
    if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low) \
            or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]" if low is not None else f"<= {high}"
        raise InvalidParam(name, f"{prefix}{name}={clip(value)} is invalid: must be an integer {bounds}")


def check_bool(name: str, value, prefix: str = "") -> None:
    if not isinstance(value, bool):
        raise InvalidParam(name, f"{prefix}{name}={clip(value)} is invalid: must be True or False")


def check_text(name: str, text: str, prefix: str = "") -> None:
    """A string must be encodable as UTF-8: a lone surrogate (from a JSON escape like \\ud800) is not text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidParam(name, f"{prefix}{name} contains a lone surrogate ({text[e.start]!r}) at character "
                                 f"{e.start}: send valid Unicode text") from None

"""A small regular-expression parser for the hand-written backend: the pattern as a tree of characters.

It reads what ``choice`` and everyday patterns need: literals, escapes (``\\d \\w \\s``, capitals, ``\\n``, ``\\t``,
an escaped punctuation mark, ``\\uXXXX``), classes (``[a-z_]``, ``[^"]``), ``.``, ``( )``, ``(?: )``, ``|``, repeats
``* + ? {n} {n,} {n,m}`` (a lazy ``?`` changes nothing: the whole output must match), ``^`` and ``$`` at the ends;
anything else (a look-around, a back-reference, ``\\b``, a Unicode property) raises `Unsupported`: xgrammar takes it.

The tree: ``("set", [(lo, hi), ...])`` one character from these code point ranges; ``("cat", [...])``;
``("alt", [...])``; ``("repeat", node, min, max or None)``.
"""
from __future__ import annotations

MAX_CODE_POINT = 0x10FFFF
# JSON Schema's patterns are ECMAScript's, and so are these (xgrammar's too): \s is Unicode white space.
CLASSES = {"d": [(48, 57)], "w": [(48, 57), (65, 90), (95, 95), (97, 122)],
           "s": [(9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
                 (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]}
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


class Unsupported(ValueError):
    """The pattern uses something this small parser does not read."""


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, at = [], 0
    for lo, hi in sorted(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = max(at, hi + 1)
    return out + ([(at, MAX_CODE_POINT)] if at <= MAX_CODE_POINT else [])


def literal(text: str) -> tuple:
    return ("cat", [("set", [(ord(c), ord(c))]) for c in text])


def parse(pattern: str) -> tuple:
    """The tree of ``pattern``, matched whole; `Unsupported` for what the parser does not read."""
    parser = Parser(pattern)
    if parser.peek() == "^":
        parser.at += 1
    tree = parser.alternation()
    if parser.peek() == "$" and parser.at == len(pattern) - 1:
        parser.at += 1
    if parser.at != len(pattern):
        raise Unsupported(f"unexpected {pattern[parser.at]!r} at position {parser.at}")
    return tree


class Parser:
    def __init__(self, pattern: str):
        self.text, self.at = pattern, 0

    def peek(self) -> str | None:
        return self.text[self.at] if self.at < len(self.text) else None

    def take(self) -> str:
        if self.at >= len(self.text):
            raise Unsupported("the pattern ends in the middle of an expression")
        self.at += 1
        return self.text[self.at - 1]

    def alternation(self) -> tuple:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self) -> tuple:
        items = []
        while self.peek() not in (None, "|", ")") and not (self.peek() == "$" and self.at == len(self.text) - 1):
            items.append(self.repeat(self.atom()))
        return ("cat", items)

    def repeat(self, node: tuple) -> tuple:
        while self.peek() in ("*", "+", "?", "{"):
            c = self.take()
            if c == "{":
                low, high = self.bounds()
            else:
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            node = ("repeat", node, low, high)
            if self.peek() == "?":  # lazy: the same language when the whole output must match
                self.at += 1
        return node

    def bounds(self) -> tuple[int, int | None]:
        end = self.text.find("}", self.at)
        body = self.text[self.at:end] if end >= 0 else ""
        parts = body.split(",")
        if end < 0 or len(parts) > 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1] and
                                                                  not parts[1].isdigit()):
            raise Unsupported(f"a repeat {{...}} at position {self.at - 1} is not {{n}}, {{n,}} or {{n,m}}")
        self.at = end + 1
        low = int(parts[0])
        high = low if len(parts) == 1 else int(parts[1]) if parts[1] else None
        if high is not None and high < low:
            raise Unsupported(f"the repeat {{{body}}} has its maximum below its minimum")
        return low, high

    def atom(self) -> tuple:
        c = self.take()
        if c == "(":
            if self.text.startswith("?:", self.at):
                self.at += 2
            elif self.peek() == "?":
                raise Unsupported(f"the group modifier at position {self.at} (a look-around or a named group)")
            node = self.alternation()
            if self.take() != ")":
                raise Unsupported("a group is not closed")
            return node
        if c == "[":
            return ("set", self.char_class())
        if c == ".":
            return ("set", [(0, MAX_CODE_POINT)])  # any character, a newline too (as xgrammar reads it)
        if c == "\\":
            return ("set", self.escape())
        if c in "*+?{)|^$":
            raise Unsupported(f"{c!r} at position {self.at - 1} has nothing to apply to")
        return ("set", [(ord(c), ord(c))])

    def escape(self) -> list[tuple[int, int]]:
        c = self.take()
        if c.lower() in CLASSES:
            ranges = CLASSES[c.lower()]
            return complement(ranges) if c.isupper() else ranges
        if c in ESCAPES:
            return [(ord(ESCAPES[c]), ord(ESCAPES[c]))]
        if c == "u":
            digits = self.text[self.at:self.at + 4]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise Unsupported(f"\\u at position {self.at - 2} needs four hexadecimal digits")
            self.at += 4
            return [(int(digits, 16), int(digits, 16))]
        if c.isalnum():
            raise Unsupported(f"the escape \\{c} (a back-reference, a boundary or a property)")
        return [(ord(c), ord(c))]

    def char_class(self) -> list[tuple[int, int]]:
        negate = self.peek() == "^"
        self.at += negate
        ranges, first = [], True
        while first or self.peek() != "]":
            first = False
            c = self.take()
            if c == "\\":
                piece = self.escape()
            else:
                piece = [(ord(c), ord(c))]
            if self.peek() == "-" and self.text[self.at + 1:self.at + 2] not in ("]", "") and len(piece) == 1 \
                    and piece[0][0] == piece[0][1]:
                self.at += 1
                end = self.take()
                high = self.escape() if end == "\\" else [(ord(end), ord(end))]
                if len(high) != 1 or high[0][0] != high[0][1] or high[0][0] < piece[0][0]:
                    raise Unsupported(f"a class range ending at position {self.at - 1} is not a range")
                piece = [(piece[0][0], high[0][0])]
            ranges += piece
        self.at += 1
        return complement(ranges) if negate else sorted(ranges)

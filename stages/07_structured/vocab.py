"""The vocabulary as bytes: what each token id writes into the output, read from the model folder's tokenizer.json.

A grammar speaks of characters, the model of tokens: the backends need each token's exact bytes. A byte-level BPE
vocabulary (GPT-2's scheme: SmolLM2, Llama 3, Qwen) spells each byte as a printable character (a space is "Ġ"), so
a token's bytes are its string mapped back. Special tokens (``<|im_start|>``) are None: never inside a structure.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from common.validate import InvalidParam


def byte_decoder() -> dict[str, int]:
    """GPT-2's table, reversed: the printable character that stands for each byte -> the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:  # the bytes that are not printable are spelled from U+0100 on, in order
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


@functools.cache
def token_bytes(folder: str, vocab_size: int) -> tuple[bytes | None, ...]:
    """Each token id below ``vocab_size`` (the model's, maybe padded): its bytes, or None (special, or not there)."""
    data = json.loads((Path(folder) / "tokenizer.json").read_text(encoding="utf-8"))
    decoder = (data.get("decoder") or {}).get("type")
    if decoder != "ByteLevel":
        raise InvalidParam("structured_outputs", f"structured outputs read a byte-level BPE vocabulary (GPT-2's "
                                                 f"scheme); this tokenizer's decoder is {decoder!r}")
    table, out = byte_decoder(), [None] * vocab_size
    for text, token_id in data["model"]["vocab"].items():
        if token_id < vocab_size:
            out[token_id] = bytes(table[c] for c in text)
    for added in data.get("added_tokens", []):
        if added["id"] < vocab_size:
            out[added["id"]] = None if added.get("special") else added["content"].encode()
    return tuple(out)

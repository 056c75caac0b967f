"""Byte-level BPE tokenizer built from the GGUF vocabulary, the ChatML template,
and an incremental detokenizer for streaming."""
from __future__ import annotations

import json
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

CONTROL_TOKEN_TYPE = 3  # llama.cpp's token_type for special tokens


def _strings(reader, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def build_tokenizer_files(reader, folder: Path, vocab_size: int | None = None) -> None:
    """Write tokenizer.json and tokenizer_config.json from a GGUF reader's vocabulary.

    With ``vocab_size`` the vocabulary is cut to its first ids and the merges to
    those whose parts and result survive (a smaller BPE that still covers every byte).
    """
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in reader.fields["tokenizer.ggml.token_type"].data]
    merges = _strings(reader, "tokenizer.ggml.merges")
    if vocab_size is not None:
        tokens, types = tokens[:vocab_size], types[:vocab_size]
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    pairs = [(a, b) for a, b in pairs if a in vocab and b in vocab and a + b in vocab]

    tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    # SmolLM2's pre-tokenizer (llama.cpp calls it "smollm"): digits one by one, then GPT-2's rules.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(folder / "tokenizer.json"))

    field = lambda k: reader.fields[k].contents()  # noqa: E731
    config = {
        "tokenizer_class": "GPT2TokenizerFast", "model_max_length": int(field("llama.context_length")),
        "bos_token": tokens[field("tokenizer.ggml.bos_token_id")],
        "eos_token": tokens[field("tokenizer.ggml.eos_token_id")],
        "unk_token": tokens[field("tokenizer.ggml.unknown_token_id")],
        "pad_token": tokens[field("tokenizer.ggml.padding_token_id")],
        "add_bos_token": False, "add_prefix_space": False, "clean_up_tokenization_spaces": False,
        "additional_special_tokens": specials, "chat_template": field("tokenizer.chat_template"),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


class Tokenizer:
    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self._tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        self.eos_token_id = self._tok.token_to_id(cfg["eos_token"])
        self.vocab_size = self._tok.get_vocab_size()
        self._template = ImmutableSandboxedEnvironment().from_string(cfg["chat_template"])

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """ChatML; with no system message, SmolLM2's default system prompt is inserted."""
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text pieces that concatenate to the full text.

    A byte-level token can end in the middle of a UTF-8 character; its decode then
    ends in U+FFFD, so the piece is held back until the character completes. Pieces
    are decoded with the previous piece's tokens as left context, so a leading
    space (which byte-level BPE folds into the token) is kept.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the context window
        self.read_offset = 0  # ids before this are already emitted as text
        self.text = ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = lambda a, b: self.tokenizer.decode(self.ids[a:b], self.skip_special_tokens)  # noqa: E731
        prefix = decode(self.prefix_offset, self.read_offset)
        full = decode(self.prefix_offset, len(self.ids))
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""  # incomplete character (or nothing visible yet): wait for more tokens
        piece = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += piece
        return piece

    def flush(self) -> str:
        """At the end of a request: whatever is still held back (a truly broken character)."""
        rest = self.tokenizer.decode(self.ids, self.skip_special_tokens)[len(self.text):]
        self.text += rest
        self.prefix_offset = self.read_offset = len(self.ids)
        return rest

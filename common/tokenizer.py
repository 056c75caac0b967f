"""Byte-level BPE tokenizer built from the GGUF vocabulary, the ChatML template,
and an incremental detokenizer for streaming."""
from __future__ import annotations

import json
import re
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

CONTROL_TOKEN_TYPE = 3  # llama.cpp's token_type for special tokens
CHAT_ROLES = ("system", "user", "assistant")
PLACEHOLDER = re.compile("\x00([0-9]+)\x00")  # a message's content while the template renders


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
        token_text = lambda t: t.get("content") if isinstance(t, dict) else t  # noqa: E731  (older configs: objects)
        self.eos_token_id = self._tok.token_to_id(token_text(cfg.get("eos_token")) or "")
        self.vocab_size = self._tok.get_vocab_size()
        self._template_globals = {"bos_token": token_text(cfg.get("bos_token")) or "",
                                  "eos_token": token_text(cfg.get("eos_token")) or ""}
        source = chat_template_source(folder, cfg)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) if source else None
        if env is not None:
            env.globals["raise_exception"] = _raise_template_error
            env.globals["strftime_now"] = lambda fmt: "26 Jul 2024" if fmt else ""  # fixed: tokens never hang on
        self._template = env.from_string(source) if env is not None else None  # the clock (Llama 3.2's template)
        # Message content is user text: this second tokenizer reads special-token strings in it as plain text.
        self._plain = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        self._plain.encode_special_tokens = True
        added = self._tok.get_added_tokens_decoder()
        self._special_ids = {t.content: i for i, t in added.items() if t.special}
        longest_first = sorted(self._special_ids, key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")")

    def encode(self, text: str) -> list[int]:
        return plain_ids(self._tok, text)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The folder's own chat template (SmolLM2's: ChatML, with its default system prompt when none is given)."""
        if self._template is None:
            raise ValueError("this checkpoint folder has no chat template (tokenizer_config.json's chat_template or "
                             "chat_template.jinja): give the prompt as text or token ids")
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **self._template_globals)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The chat prompt's token ids, in which a message's content is always text, never control tokens.

        The template is rendered with a placeholder for each content and split at its own special
        tokens; each piece between them is encoded with the contents filled in, by a tokenizer that
        matches no special token. Without special-token text in any content these are the pieces
        `encode(apply_chat_template(...))` encodes, so the ids are the same; with it, that text stays text
        (`<|im_end|>` in a message cannot end the turn and start a forged system turn).
        """
        for i, m in enumerate(messages):
            if m.get("role") not in CHAT_ROLES:
                raise ValueError(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}")
            if not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}].content must be a string")
        marks = [{"role": m["role"], "content": f"\x00{i}\x00"} for i, m in enumerate(messages)]
        fill = lambda piece: PLACEHOLDER.sub(lambda p: messages[int(p[1])]["content"], piece)  # noqa: E731
        ids = []
        for piece in self._special_split.split(self.apply_chat_template(marks, add_generation_prompt)):
            if piece in self._special_ids:
                ids.append(self._special_ids[piece])
            elif piece:
                ids += plain_ids(self._plain, fill(piece))
        return ids


LONG_TEXT = 4096  # characters: a longer text is encoded with Python's lock released


def plain_ids(tok: HFTokenizer, text: str) -> list[int]:
    """``text``'s token ids. A long text goes through ``encode_batch``, which releases Python's lock while it
    runs (``encode`` holds it: a 1 MB text held every other thread, the engine's included, for about a second);
    the ids are the same."""
    if len(text) > LONG_TEXT:
        return tok.encode_batch([text], add_special_tokens=False)[0].ids
    return tok.encode(text, add_special_tokens=False).ids


def chat_template_source(folder: Path, cfg: dict) -> str | None:
    """The folder's chat template: tokenizer_config.json's (a string, or a list of named ones: 'default'),
    else chat_template.jinja (what transformers 5 writes), else None."""
    template = cfg.get("chat_template")
    if isinstance(template, list):
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    return template


def _raise_template_error(message: str):
    raise ValueError(f"the chat template refused the messages: {message}")


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
        # lab 05.1 begin: the incremental detokenizer
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
        # lab 05.1 end

    def flush(self) -> str:
        """At the end of a request: whatever is still held back (a truly broken character)."""
        # lab 05.1 begin: flush what is held back
        rest = self.tokenizer.decode(self.ids, self.skip_special_tokens)[len(self.text):]
        self.text += rest
        self.prefix_offset = self.read_offset = len(self.ids)
        return rest
        # lab 05.1 end

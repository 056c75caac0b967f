"""Tokenizer built from the GGUF vocabulary vs transformers' tokenizer for the same GGUF."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from common.tokenizer import IncrementalDetokenizer, Tokenizer
from workloads import examples

CORPUS = [
    "Hello, world!", " leading space", "  two leading spaces", "trailing space ", "tabs\tand\nnewlines\n\n",
    "Ünïcödé façade naïve café", "日本語のテキスト", "emoji 😀👍🏽🚀 and flags 🇫🇷", "مرحبا بالعالم",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "1234567890 3.14159 1e-9 0xFF", "    \n\n\t\t   \r\n", "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>text after end", "MiXeD CaSe AND UPPER", "a" * 300, "https://example.com/path?q=1&r=2",
    "don't won't it's", "¿Qué? ¡Sí!", "x" + "\u200b" + "y",
]


@pytest.fixture(scope="module")
def ours(real_folder):
    return Tokenizer(real_folder)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoTokenizer

    from common.paths import smollm2_gguf_path
    g = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)


@pytest.mark.parametrize("text", CORPUS)
@pytest.mark.real_model
def test_encode_decode_agree_with_transformers(ours, hf, text):
    ids = ours.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == text


@pytest.mark.real_model
def test_chat_template_has_default_system_prompt(ours):
    text = ours.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = ours.encode(text)
    assert ids[0] == ours.token_to_id("<|im_start|>") == 1 and ours.eos_token_id == 2


@settings(max_examples=examples(60), deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=80))
@pytest.mark.real_model
def test_incremental_detokenizer_concatenates_to_full_text(ours, text):
    ids = ours.encode(text)
    detok = IncrementalDetokenizer(ours)
    pieces = [detok.add(t) for t in ids] + [detok.flush()]
    full = ours.decode(ids)
    assert "".join(pieces) == full
    if "\ufffd" not in full:  # (a few rare bytes are missing from SmolLM2's vocabulary)
        assert all("\ufffd" not in p for p in pieces)


@pytest.mark.real_model
def test_incremental_detokenizer_on_random_ids_concatenates(ours):
    """Random ids make invalid UTF-8 too; the pieces must still add up to the full decode."""
    rng = random.Random(0)
    for _ in range(30):
        ids = [rng.randrange(17, 49152) for _ in range(40)]
        detok = IncrementalDetokenizer(ours)
        pieces = [detok.add(t) for t in ids]
        pieces.append(detok.flush())
        assert "".join(pieces) == ours.decode(ids)


def test_tiny_vocabulary_is_a_working_bpe(tiny_folder):
    tok = Tokenizer(tiny_folder)
    assert tok.vocab_size == 1024
    for text in CORPUS:
        ids = tok.encode(text)
        assert max(ids) < 1024 and tok.decode(ids, skip_special_tokens=False) == text


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return Tokenizer(tiny_folder)


def test_incremental_detokenizer_holds_back_a_character_split_over_byte_tokens(tiny):
    """The tiny vocabulary spells "é" as two byte tokens: the first alone decodes to U+FFFD, so nothing is shown
    until the second completes the character."""
    ids = tiny.encode("café")
    assert ids[:3] == tiny.encode("caf") and len(ids) == 5 and tiny.decode(ids[3:4]) == "\ufffd"
    detok = IncrementalDetokenizer(tiny)
    assert [detok.add(t) for t in ids] == ["c", "a", "f", "", "é"] and detok.flush() == ""
    cut = IncrementalDetokenizer(tiny)  # a request that ends mid-character flushes the broken byte at its end
    assert [cut.add(t) for t in ids[:4]] == ["c", "a", "f", ""] and cut.flush() == "\ufffd"


@settings(max_examples=examples(60), deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40))
def test_incremental_detokenizer_on_byte_tokens_concatenates_without_broken_pieces(tiny, text):
    """Fast twin of the real-model test: the tiny vocabulary (1,024 ids) splits most non-ASCII characters into byte
    tokens, so nearly every character beyond ASCII arrives in pieces."""
    ids = tiny.encode(text)
    detok = IncrementalDetokenizer(tiny)
    pieces = [detok.add(t) for t in ids]
    full = tiny.decode(ids)
    assert "".join(pieces) + detok.flush() == full
    if "\ufffd" not in full:  # (as in SmolLM2's, a few rare bytes are missing from the vocabulary)
        assert all("\ufffd" not in p for p in pieces)

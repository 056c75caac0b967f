"""The graders of stages 04 and 05: a Triton kernel bit for bit against common/numerics/ops.py, and streamed
text against the whole decode, on SmolLM2's real tokenizer and real multilingual text."""
from __future__ import annotations

import functools

import torch
from hypothesis import given, strategies as st

from common.paths import DEFAULT_MODEL
from common.engine import SeqOutput, advance
from common.numerics import ops
from common.prepare import resolve_model
from common.sampling import SamplingParams
from common.sequence import Sequence
from common.tokenizer import Tokenizer

from .examples import hypothesis

# Accents, CJK, emoji with a skin-tone modifier: byte-level tokens that end inside a UTF-8 character.
TEXTS = [
    "Le café naïve coûte 3 € — déjà vu, señor?",
    "日本語のテキストを少し。東京は晴れです。",
    "Thumbs up 👍🏽 and a rocket 🚀, then plain ASCII again.",
    "Ελληνικά και русский текст: ёжик в тумане.",
]


def first_difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    bad = (got != expected) & ~(got.isnan() & expected.isnan())
    idx = tuple(int(i) for i in bad.nonzero()[0]) if bad.any() else None
    return (f"{int(bad.sum())} of {got.numel()} elements differ; first at {idx}: expected "
            f"{expected[idx].item()!r}, produced {got[idx].item()!r}") if idx else "shapes or dtypes differ"


def rms_case(ew, rows: int, hidden: int, with_residual: bool, dtype: torch.dtype, seed: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(seed)
    x, res, w = (torch.randn(*s, generator=g).mul(4).to(dtype).to(device) for s in
                 [(rows, hidden), (rows, hidden), (hidden,)])
    expected, expected_res = ops.add_rms_norm(x, res.clone() if with_residual else None, w, 1e-5)
    out, new_res = ew.add_rms_norm(x, res if with_residual else None, w, 1e-5)
    case = f"rows={rows}, hidden={hidden}, residual={with_residual}, {dtype}, seed={seed}"
    assert new_res.shape == expected_res.shape and torch.equal(new_res, expected_res), (
        f"the residual stream (x + residual) is not ops.add_rms_norm's ({case}): "
        f"{first_difference(new_res, expected_res)}")
    assert out.shape == expected.shape and torch.equal(out, expected), (
        f"the normed output is not ops.add_rms_norm's bit for bit ({case}): {first_difference(out, expected)}")


def check_04_1(v) -> None:
    """Bit for bit: in the Triton interpreter on CPU in float32 (it truncates 16-bit stores instead of rounding),
    compiled on CUDA in every dtype."""
    ew = v.module("elementwise")
    dtypes = [torch.float32, torch.float16, torch.bfloat16] if torch.cuda.is_available() else [torch.float32]
    for dtype in dtypes:
        for rows, hidden, with_residual in [(3, 48, True), (2, 32, False), (1, 576, True)]:
            rms_case(ew, rows, hidden, with_residual, dtype, 0)

    @hypothesis(6)
    @given(rows=st.integers(1, 3), lanes=st.integers(1, 6), with_residual=st.booleans(),
           dtype=st.sampled_from(dtypes), seed=st.integers(0, 2**16))
    def bit_for_bit(rows, lanes, with_residual, dtype, seed):
        rms_case(ew, rows, lanes * ops.LANES, with_residual, dtype, seed)

    bit_for_bit()


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer(resolve_model(DEFAULT_MODEL))


def detokenize(module, ids: list[int]) -> None:
    tok = tokenizer()
    final, shown = tok.decode(ids), ""
    det = module.IncrementalDetokenizer(tok)
    for k in range(len(ids)):
        shown += det.add(ids[k])
        so_far = tok.decode(ids[:k + 1])
        assert final.startswith(shown), (f"after token {k + 1} of {ids} the stream shows {shown!r}, which is not "
                                         f"how the text {final!r} begins (half a character shown as U+FFFD?)")
        if not so_far.endswith("\ufffd"):
            assert shown == so_far, (f"after token {k + 1} of {ids} the text so far is {so_far!r}, complete, but the "
                                     f"stream shows only {shown!r}: a complete character was held back")
    shown += det.flush()
    assert shown == final, f"the pieces and the flush of {ids} make {shown!r}, not the whole decode {final!r}"


def check_05_1(v) -> None:
    module = v.module("common/tokenizer")
    for text in TEXTS:
        detokenize(module, tokenizer().encode(text))
    detokenize(module, tokenizer().encode("🚀")[:1])  # a character that never completes: flushed at the end

    @hypothesis(8)
    @given(text=st.sampled_from(TEXTS), start=st.integers(0, 20), length=st.integers(1, 20))
    def any_window(text, start, length):
        ids = tokenizer().encode(text)
        detokenize(module, ids[start:start + length] or ids[:1])  # a window can begin or end mid-character

    any_window()


def stream(streams, ids: list[int], stop: str) -> None:
    """Feed ``ids`` to a request with stop string ``stop`` as the engine does, showing what the stream may show."""
    tok = tokenizer()
    whole = tok.decode(ids)
    want = whole[:whole.find(stop)] if stop in whole else whole
    seq = Sequence([1], SamplingParams(max_tokens=len(ids), stop=[stop], ignore_eos=True), -1, torch.device("cpu"))
    seq.detokenizer = module_detokenizer(tok)
    shown = ""
    for k, token in enumerate(ids):
        advance(seq, 1, SeqOutput([token]))
        now = seq.output_text[:streams.stable_text_len(seq)]
        assert now.startswith(shown) and want.startswith(now), (
            f"stop string {stop!r}: after token {k + 1} the stream would show {now!r}, but it had shown {shown!r} "
            f"and the final text is {want!r} (a stop string arriving over later tokens takes text back)")
        shown = now
        if seq.is_finished:
            break
    assert shown == want, f"stop string {stop!r}: the stream showed {shown!r} in all; the final text is {want!r}"


def module_detokenizer(tok):
    from common.tokenizer import IncrementalDetokenizer  # the solution's: 05.2 is graded on its own
    return IncrementalDetokenizer(tok)


def check_05_2(v) -> None:
    streams = v.module("streams")
    stream(streams, tokenizer().encode(TEXTS[0]), "coûte 3")  # across several tokens
    stream(streams, tokenizer().encode(TEXTS[2]), "rocket")
    stream(streams, tokenizer().encode(TEXTS[1]), "no such stop")  # never found: everything is shown

    @hypothesis(8)
    @given(text=st.sampled_from(TEXTS), start=st.integers(0, 40), length=st.integers(1, 8))
    def any_stop_string(text, start, length):
        stop = text[start:start + length] or text[:length]
        stream(streams, tokenizer().encode(text), stop)

    any_stop_string()

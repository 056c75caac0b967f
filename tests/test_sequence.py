"""`Sequence`'s own rules, checked absolutely: every engine and the reference run this code, so comparing one with
the other cannot see a mistake in it. When a request stops and why, and where its text ends."""
import pytest
import torch

from common import SamplingParams, Sequence

EOS = 2


class Pieces:
    """A detokenizer whose token ``i`` reads as ``texts[i]``."""

    def __init__(self, texts: dict[int, str]):
        self.texts = texts

    def add(self, token_id: int) -> str:
        return self.texts.get(token_id, "")

    def flush(self) -> str:
        return ""


def run(tokens: list[int], texts: dict[int, str] | None = None, **params) -> Sequence:
    """Feed ``tokens`` one at a time as the engines do (`common.engine.advance`) until the request finishes."""
    seq = Sequence([5, 6, 7], SamplingParams(**params), EOS, torch.device("cpu"))
    seq.detokenizer = Pieces(texts or {})
    for token in tokens:
        assert not seq.is_finished, "a token after the request finished"
        seq.append_token(token)
        if (reason := seq.stop_reason()) is not None:
            seq.finish(reason)
    return seq


@pytest.mark.parametrize("last, params", [
    (30, {"stop_token_ids": [30]}),  # a stop token
    (EOS, {}),  # EOS
    (31, {"stop": ["xy"]}),  # a stop string completed by the last token
])
def test_a_stop_on_the_last_allowed_token_finishes_with_stop_not_length(last, params):
    """Finish-reason precedence: a stop (stop token, EOS, stop string) wins over the length limit, as in vLLM."""
    seq = run([10, 11, last], {11: "ab x", 31: "y"}, max_tokens=3, **params)
    assert seq.output_token_ids == [10, 11, last]
    assert seq.finish_reason == "stop"


def test_the_length_limit_alone_finishes_with_length():
    assert run([10, 11, 12], max_tokens=3, stop_token_ids=[30]).finish_reason == "length"
    assert run([10, EOS, 12], max_tokens=3, ignore_eos=True).finish_reason == "length"  # EOS ignored
    seq = Sequence([5, 6, 7], SamplingParams(max_tokens=50), EOS, torch.device("cpu"))
    seq.max_len = 5  # the engine's max_model_len: the prompt's 3 tokens and 2 more
    seq.append_token(10)
    assert seq.stop_reason() is None
    seq.append_token(11)
    assert seq.stop_reason() == "length"


def test_the_text_ends_before_the_earliest_stop_match_whichever_string_it_is():
    """Cut at the earliest match: both stop strings complete on the last token; ",e" starts first, so the text ends
    there even though "rt" is listed first."""
    seq = run([10, 11], {10: "ab,", 11: "ert"}, max_tokens=10, stop=["rt", ",e"])
    assert seq.finish_reason == "stop"
    assert seq.output_text == "ab"
    later = run([10, 11], {10: "ab,", 11: "ert"}, max_tokens=10, stop=[",e", "rt"])  # the order listed is no matter
    assert later.output_text == "ab"


def test_a_stop_string_spanning_tokens_cuts_inside_the_earlier_one():
    seq = run([10, 11, 12], {10: "one t", 11: "w", 12: "o three"}, max_tokens=10, stop=["two", "three"])
    assert (seq.output_text, seq.finish_reason, seq.output_token_ids) == ("one ", "stop", [10, 11, 12])


def test_a_stop_string_at_the_very_start_leaves_no_text():
    seq = run([10], {10: "##"}, max_tokens=5, stop=["##"])
    assert (seq.output_text, seq.finish_reason, seq.output_token_ids) == ("", "stop", [10])


def test_a_token_that_brings_a_stop_string_twice_is_cut_at_the_first():
    seq = run([10, 11], {10: "ab", 11: ",e,e"}, max_tokens=5, stop=[",e"])
    assert (seq.output_text, seq.finish_reason) == ("ab", "stop")

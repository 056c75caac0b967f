import pytest
import torch

from common.sampling import SamplingParams, greedy_tokens, make_generator, sample


@pytest.mark.parametrize("kwargs,field", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"), ({"temperature": -1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"top_k": -3}, "top_k"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"seed": -1}, "seed"), ({"stop_token_ids": [-4]}, "stop_token_ids"),
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}="):
        SamplingParams(**kwargs)


def test_stop_token_out_of_vocabulary():
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[5000]).validate(vocab_size=1024)


def test_seeded_draws_repeat_and_follow_the_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2, 0.0]))
    p = SamplingParams(temperature=1.0, seed=7)
    draws = lambda: [sample(logits, p, g) for g in [make_generator(p, torch.device("cpu"))] for _ in range(2000)]  # noqa
    a, b = draws(), draws()
    assert a == b
    freq = torch.bincount(torch.tensor(a), minlength=4).float() / len(a)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.04, rtol=0)


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    g = torch.Generator().manual_seed(0)
    assert {sample(logits, SamplingParams(temperature=5, top_k=2), g) for _ in range(300)} == {0, 1}
    # softmax(logits) ~ [0.64, 0.24, 0.09, ...]: top_p=0.8 keeps the first two.
    assert {sample(logits, SamplingParams(temperature=1, top_p=0.8), g) for _ in range(300)} == {0, 1}
    assert sample(logits, SamplingParams(temperature=0), None) == 0


@pytest.mark.parametrize("vocab", [1024, 49152, 1000, 3000])
def test_greedy_tokens_equal_argmax_with_ties(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab, generator=gen)
    top = logits.max() + 1
    logits[1, [5, vocab - 1]] = top  # a tie inside the vocabulary: the first index wins
    logits[2, [vocab - 2, vocab - 1]] = top  # a tie in the last chunk
    logits[3, [1023 % vocab, min(1024, vocab - 1)]] = top  # a tie across a chunk boundary
    logits[4] = 0.0  # every entry tied
    assert greedy_tokens(logits) == logits.argmax(-1).tolist()

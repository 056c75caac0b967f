import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from common.sampler import greedy_tokens, make_generator, nucleus, sample, sample_batch
from common.sampling import SamplingParams
from workloads import examples


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
    logits[1, [5, vocab - 1]] = top  # a tie: the first index wins
    logits[2, [vocab - 2, vocab - 1]] = top  # a tie at the end
    logits[3, [1023 % vocab, min(1024, vocab - 1)]] = top  # a tie of neighbours
    logits[4] = 0.0  # every entry tied
    assert greedy_tokens(logits) == logits.argmax(-1).tolist()


# Exact ties, under vLLM's rule (`apply_top_k_top_p` in vllm/v1/sample/ops/topk_topp_sampler.py):
# * top-k keeps every token whose logit is >= the k-th largest, so tokens tied with the k-th are all kept;
# * top-p sorts ascending and drops each token whose cumulative probability (itself and every smaller one) is
#   <= 1 - top_p, always keeping the largest; in descending order: a token is dropped exactly when the tokens
#   ranked before it already hold top_p of the mass, so the kept set is the shortest head that reaches top_p.
# Equal logits give exact probabilities (1/n) in float32, so these cases sit exactly on the boundary.
def support(logits, params, draws=400):
    g = torch.Generator().manual_seed(0)
    return {sample(logits, params, g) for _ in range(draws)}


@pytest.mark.parametrize("top_k, kept", [
    (1, {0}), (2, {0, 1, 2}), (3, {0, 1, 2}),  # k=2 ends inside the tie at 2.0: both tied tokens stay
    (4, {0, 1, 2, 3, 4, 5}), (6, {0, 1, 2, 3, 4, 5}), (7, {0, 1, 2, 3, 4, 5, 6}),
])
def test_top_k_keeps_every_token_tied_with_the_kth(top_k, kept):
    logits = torch.tensor([3.0, 2.0, 2.0, 1.0, 1.0, 1.0, -1.0]) * 0.01  # nearly flat: every kept token gets drawn
    assert support(logits, SamplingParams(temperature=1.0, top_k=top_k)) == kept


@pytest.mark.parametrize("n, top_p, kept", [
    (4, 0.25, 1), (4, 0.5, 2), (4, 0.75, 3), (4, 1.0, 4),  # the head reaches top_p exactly: nothing more is kept
    (4, 0.2499, 1), (4, 0.5001, 3), (8, 0.375, 3), (8, 0.5, 4), (8, 0.3751, 4),
])
def test_top_p_at_an_exact_tie_keeps_the_shortest_head_that_reaches_it(n, top_p, kept):
    logits = torch.zeros(n)  # probability exactly 1/n each
    got = support(logits, SamplingParams(temperature=1.0, top_p=top_p))
    assert len(got) == kept and got <= set(range(n))


def test_top_k_then_top_p_on_what_top_k_kept():
    # top-k=4 keeps four equal tokens (1/4 each after renormalising); top-p=0.5 then keeps two of them.
    logits = torch.tensor([0.0, 0.0, 0.0, 0.0, -5.0, -5.0])
    got = support(logits, SamplingParams(temperature=1.0, top_k=4, top_p=0.5))
    assert len(got) == 2 and got <= {0, 1, 2, 3}


def test_each_request_draws_from_its_own_seeded_stream():
    """Two rows with the same seed in one batch draw exactly what each draws alone; a shared generator would not."""
    logits = torch.zeros(3, 50)
    params = [SamplingParams(temperature=1.0, seed=5), SamplingParams(temperature=1.0, seed=5),
              SamplingParams(temperature=1.0, seed=6)]
    cpu = torch.device("cpu")
    gens = [make_generator(p, cpu) for p in params]
    batched = [sample_batch(logits, params, gens) for _ in range(20)]
    alone = [[sample(logits[0], params[i], g) for g in [make_generator(params[i], cpu)] for _ in range(20)]
             for i in range(3)]
    assert [row[0] for row in batched] == [row[1] for row in batched] == alone[0] == alone[1]
    assert [row[2] for row in batched] == alone[2] != alone[0]


def test_temperature_divides_the_logits():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    for t in (0.5, 2.0):
        p = SamplingParams(temperature=t, seed=11)
        g = make_generator(p, torch.device("cpu"))
        freq = torch.bincount(torch.tensor([sample(logits, p, g) for _ in range(4000)]), minlength=3).float() / 4000
        torch.testing.assert_close(freq, torch.softmax(logits / t, -1), atol=0.03, rtol=0)


def test_top_k_zero_or_minus_one_keeps_every_token():
    logits = torch.zeros(6)
    for k in (0, -1):
        assert support(logits, SamplingParams(temperature=1.0, top_k=k)) == set(range(6))


def test_greedy_rows_of_a_batch_take_their_own_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.0], [2.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 5.0]])
    params = [SamplingParams(temperature=0)] * 3
    assert sample_batch(logits, params, [None] * 3) == [1, 0, 3]


@settings(max_examples=examples(60), deadline=None)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.sampled_from([5, 64, 1000, 49152]),
       top_p=st.floats(0.01, 0.99), spread=st.sampled_from([0.1, 1.0, 4.0]))
@example(seed=128, vocab=49152, top_p=0.5, spread=0.1)  # tokens 15245 and 40003 tie (2.0439647e-05) at the cutoff
def test_the_nucleus_is_the_head_a_full_sort_finds(seed, vocab, top_p, spread):
    """Oracle: the old sampler's definition, a full descending sort and the drop rule on its cumulative sum. Random
    float32 probabilities do tie now and then, even at the cutoff: the order is then `nucleus`'s tie rule (of equal
    probabilities the lower id ranks first, so the lowest ids stay), which a stable descending sort gives."""
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * spread
    probs = torch.softmax(logits, -1)
    ordered, order = torch.sort(probs, descending=True, stable=True)
    drop = (ordered.cumsum(-1) - ordered) >= top_p
    expected = torch.zeros(vocab, dtype=torch.bool).scatter(0, order, ~drop)
    assert torch.equal(nucleus(probs, top_p), expected)


def test_of_tied_tokens_at_the_nucleus_edge_the_lowest_ids_stay():
    probs = torch.tensor([0.1, 0.2, 0.1, 0.4, 0.1, 0.1])  # head 0.4, 0.2, then one of four tied at 0.1
    assert nucleus(probs, 0.65).tolist() == [True, True, False, True, False, False]


def test_a_draw_at_the_very_top_takes_the_last_token_with_mass(monkeypatch):
    """The draw is scaled by the total mass; were it to round up to the total, no cumulative entry would exceed it."""
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1, dtype=torch.float64))
    logits = torch.log(torch.tensor([0.2, 0.5, 0.3, 0.0, 0.0]))
    assert sample(logits, SamplingParams(temperature=1.0), torch.Generator()) == 2


def test_one_uniform_draw_a_token_from_the_requests_stream():
    """Inverse transform: the token is the first whose cumulative probability exceeds the request's next uniform."""
    logits = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    gen, twin = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(50):
        u = float(torch.rand(1, generator=twin, dtype=torch.float64))
        cumulative = torch.softmax(logits, -1).double().cumsum(0)
        assert sample(logits, SamplingParams(temperature=1.0), gen) == int((cumulative <= u * cumulative[-1]).sum())


@pytest.mark.parametrize("spread, top_p", [(4.0, 0.5), (4.0, 0.95), (0.2, 0.9), (1.0, 0.999)])
def test_the_nucleus_found_in_the_head_is_the_one_the_whole_row_gives(spread, top_p, monkeypatch):
    """Peaked rows find their nucleus among the largest 1,024 probabilities, flat ones need the whole row; forcing the
    whole row every time must not change a token of the kept set."""
    import common.sampler as sampling
    probs = torch.softmax(torch.randn(49152, generator=torch.Generator().manual_seed(7)) * spread, -1)
    from_head = nucleus(probs, top_p)
    whole_row = sampling.descending_heads
    monkeypatch.setattr(sampling, "descending_heads", lambda p: whole_row(p, first=p.numel()))
    assert torch.equal(nucleus(probs, top_p), from_head)


def test_drawing_among_the_kept_tokens_is_drawing_from_the_masked_row():
    """With top-p the draw runs over the kept tokens' probabilities alone; over the whole row with the others zeroed
    (their exact zeros change no cumulative sum) the same uniform gives the same token."""
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(3)) * 3
    params = SamplingParams(temperature=0.9, top_p=0.8)
    gen, twin = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for _ in range(40):
        probs = torch.softmax(logits / 0.9, -1)
        masked = probs.masked_fill(~nucleus(probs, 0.8), 0.0).double().cumsum(0)
        u = float(torch.rand(1, generator=twin, dtype=torch.float64))
        assert sample(logits, params, gen) == int((masked <= u * masked[-1]).sum())


def test_a_draw_of_zero_never_takes_a_token_without_mass(monkeypatch):
    """u = 0 lands on the first cumulative entry above 0, never on a masked token at the front."""
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(1, dtype=torch.float64))
    logits = torch.tensor([float("-inf"), float("-inf"), 0.3, 0.1])
    assert sample(logits, SamplingParams(temperature=1.0), torch.Generator()) == 2
    assert sample(torch.tensor([-5.0, 3.0, 2.0, 1.0]), SamplingParams(temperature=1.0, top_k=2), torch.Generator()) == 1

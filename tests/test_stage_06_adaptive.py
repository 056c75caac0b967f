"""Stage 06's adaptive drafting (cost_model.py): drafts are fed only where they pay, and every token stays the
reference's whatever the policy feeds.

Oracles: for the choice, a brute-force search over every allocation of drafts (the lesson's arithmetic: expected
tokens 1 + α + ... + α^k per request, over the step's time at its rows); for the fit, a line it must recover; for
the engine, the one-request-at-a-time reference under a cost curve that makes the policy feed arbitrary parts of
the proposals, and under the two extremes (rows dearer than they return: nothing fed; free rows: everything).
"""
import importlib
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common import ReferenceLLM
from common.validate import InvalidParam
from test_stage_06_speculative import (  # noqa: F401  (drafts_never_preempt: the autouse fixture, here too)
    NGRAM, drafts_never_preempt, repetitive_workloads, same_outputs, spec_llm)
from workloads import examples

cost_model = importlib.import_module("stages.speculative.cost_model")
engine = importlib.import_module("stages.speculative.engine")


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


class Curve:
    """A fake step cost: seconds = a + b * rows, whatever the engine measures (``observe`` is ignored)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def seconds(self, base_rows, rows):
        return self.a + self.b * rows

    def observe(self, *_):
        pass


class Jitter(Curve):
    """A cost that changes at random on every reading: the policy feeds arbitrary parts of the proposals."""

    def __init__(self, seed):
        super().__init__(1.0, 0.0)
        self.rng = random.Random(seed)

    def seconds(self, base_rows, rows):
        return 1.0 + self.rng.random() * 0.4 * (rows - base_rows)


def expected_tokens(alpha, k):
    return sum(min(alpha, cost_model.ALPHA_MAX) ** j for j in range(k + 1))


@settings(max_examples=examples(300), deadline=None)
@given(alphas=st.lists(st.floats(0, 1), min_size=1, max_size=3), data=st.data(), a=st.floats(0.1, 5),
       b=st.floats(0, 2), extra=st.integers(0, 3))
def test_the_choice_is_the_best_allocation_by_brute_force(alphas, data, a, b, extra):
    lengths = [data.draw(st.integers(0, 3)) for _ in alphas]
    base_tokens, base_rows, cost = len(alphas), len(alphas) + extra, Curve(a, b)
    ks = cost_model.best_drafts(alphas, lengths, base_tokens, base_rows, cost)
    assert all(0 <= k <= n for k, n in zip(ks, lengths))

    def rate(ks):
        tokens = base_tokens + sum(expected_tokens(al, k) - 1 for al, k in zip(alphas, ks))
        return tokens / cost.seconds(base_rows, base_rows + sum(ks))

    best = max(rate(c) for c in itertools.product(*[range(n + 1) for n in lengths]))
    assert rate(ks) == pytest.approx(best, rel=1e-9)


@settings(max_examples=examples(200), deadline=None)
@given(alphas=st.lists(st.floats(0, 1), min_size=1, max_size=64), data=st.data(), a=st.floats(0.01, 5),
       b=st.floats(0, 0.2))
def test_the_search_stops_early_yet_finds_the_best_count_for_many_long_drafts(alphas, data, a, b):
    """Up to 64 requests of up to 16 drafts (a prediction's): the best D draft positions by worth, over every D."""
    lengths, cost, n = [data.draw(st.integers(0, 16)) for _ in alphas], Curve(a, b), len(alphas)
    ks = cost_model.best_drafts(alphas, lengths, n, n, cost)
    worths = sorted((min(al, cost_model.ALPHA_MAX) ** j for al, m in zip(alphas, lengths) for j in range(1, m + 1)),
                    reverse=True)
    best = max((n + sum(worths[:d])) / cost.seconds(n, n + d) for d in range(len(worths) + 1))
    got = n + sum(expected_tokens(al, k) - 1 for al, k in zip(alphas, ks))
    assert all(0 <= k <= m for k, m in zip(ks, lengths))
    assert got / cost.seconds(n, n + sum(ks)) == pytest.approx(best, rel=1e-9)


def test_never_drafts_where_rows_cost_more_than_they_return_and_drafts_all_where_rows_are_free():
    alphas, lengths = [0.9, 0.6, 0.99], [4, 4, 4]
    # every row costs what a token is worth at the base rate (no fixed part): a draft worth < 1 token never pays
    assert cost_model.best_drafts(alphas, lengths, 3, 3, Curve(0.0, 1.0)) == [0, 0, 0]
    assert cost_model.best_drafts(alphas, lengths, 3, 3, Curve(1.0, 0.0)) == [4, 4, 4]
    assert cost_model.best_drafts([0.0, 0.9], [4, 4], 2, 2, Curve(1.0, 0.0)) == [0, 4]  # worth nothing: not fed
    # one request, a step's fixed cost ten rows' worth: the drafts stop where the next one adds less than it costs
    ks = cost_model.best_drafts([0.5], [8], 1, 1, Curve(1.0, 0.1))
    assert ks == [max(range(9), key=lambda k: expected_tokens(0.5, k) / (1.0 + 0.1 * (1 + k)))]


def test_the_step_cost_recovers_a_line_through_the_fastest_step_at_each_row_count():
    cost = cost_model.StepCost(window=32)
    assert cost.line(4) is None and cost.seconds(4, 8) == 1.0
    for rows in (4, 6, 8, 10, 12):
        cost.observe(4, rows, 0.010 + 0.002 * rows)
        cost.observe(4, rows, 0.010 + 0.002 * rows + 0.05)  # another process slowed this one down
    a, b = cost.line(4)
    assert a == pytest.approx(0.010) and b == pytest.approx(0.002)
    assert cost.line(64) == (a, b)  # a size class not measured reads the nearest one measured
    cost = cost_model.StepCost(window=4)
    cost.observe(1, 1, 0.010)
    assert cost.line(1) is None  # one row count: no slope yet
    cost.observe(1, 5, 0.020)
    for _ in range(8):
        cost.observe(1, 1, 0.010)  # steps without drafts alone, until no other row count is left: the slope is kept
    assert cost.line(1) == pytest.approx((0.0075, 0.0025))  # (for fewer than ``stale`` such steps: the test below)


def test_a_dear_reading_from_a_noisy_moment_is_refitted_once_steps_are_cheap():
    """A line that says rows are dear stops the drafts whose rows could refit it. Real steps cost 10 ms + 2 ms a row,
    but the first drafted step came at a noisy moment (another process: 400 ms), so no draft pays by the line: it
    goes stale, its slope is halved until the best drafts are fed again, and those steps refit it to the real line.
    Where rows really are dear, the same costs a probe now and then (at most one step in ``stale``)."""
    for real, alpha, noisy in ((Curve(0.010, 0.002), 0.9, 0.400), (Curve(0.010, 0.050), 0.5, None)):
        cost, fed = cost_model.StepCost(), []
        cost.observe(1, 1, real.seconds(1, 1))
        cost.observe(1, 5, noisy or real.seconds(1, 5))
        for _ in range(300):
            fed += cost_model.best_drafts([alpha], [4], 1, 1, cost)
            cost.observe(1, 1 + fed[-1], real.seconds(1, 1 + fed[-1]))
        best = max(range(5), key=lambda k: expected_tokens(alpha, k) / real.seconds(1, 1 + k))  # by the real curve
        assert fed[0] == 0  # the line the noisy reading (or the real dear one) fits: no draft pays
        if noisy:
            assert best == 4 and fed[-50:] == [best] * 50 and cost.line(1) == pytest.approx((real.a, real.b))
        else:
            assert best == 0 and 0 < sum(k > 0 for k in fed) <= len(fed) / cost.stale


def test_one_noisy_step_at_a_rare_row_count_does_not_flip_the_choice():
    """Four requests feeding 0-2 drafts a step, the line fitted from many steps at 4-6 rows; one step at 8 rows comes
    at a noisy moment (twice its time). The fastest step at each row count stands for it, weighted by its steps, so
    that one step barely moves the line: the choice stays the real curve's."""
    real, alphas, cost = Curve(0.020, 0.001), [0.6] * 4, cost_model.StepCost()
    for _ in range(16):
        for rows in (4, 5, 6):
            cost.observe(4, rows, real.seconds(4, rows))
    choice = cost_model.best_drafts(alphas, [4] * 4, 4, 4, real)
    assert cost_model.best_drafts(alphas, [4] * 4, 4, 4, cost) == choice and sum(choice) > 0
    cost.observe(4, 8, 2 * real.seconds(4, 8))
    assert cost_model.best_drafts(alphas, [4] * 4, 4, 4, cost) == choice


def test_acceptance_is_scored_from_what_each_proposal_would_have_kept():
    """A proposal is scored against the tokens the step kept, fed or not: 2 matched then a miss is 2 of 3 tried;
    a proposal longer than the tokens kept counts only the positions they reach."""
    policy = cost_model.AdaptiveDrafts(Curve(1.0, 0.0), prior=0.5, prior_weight=2.0, decay=1.0)
    seq = type("Seq", (), {"seq_id": 7, "token_ids": [1, 2, 3]})()
    policy.choose([seq], ["x"], [[4, 5, 9, 9]], 1, 1)
    seq.token_ids += [4, 5, 6]
    policy.score()
    assert policy.own[7] == [2, 3] and policy.kinds["x"] == [2, 3]
    assert policy.acceptance(seq, "x") == pytest.approx((2 + 2 * (2 + 1) / (3 + 2)) / (3 + 2))
    policy.choose([seq], ["x"], [[7, 8, 9]], 1, 1)
    seq.token_ids += [7]
    policy.score()
    assert policy.own[7] == [3, 4]  # one position reached, matched: nothing known past it


def adaptive_llm(cost, monkeypatch, config=NGRAM, **kw):
    monkeypatch.setattr(engine, "speculative_policy", lambda config: cost_model.AdaptiveDrafts(cost))
    return spec_llm({**config, "enable_adaptive_verification": True}, **kw)


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=repetitive_workloads(), k=st.integers(1, 6), blocks=st.integers(24, 80), budget=st.integers(8, 40),
       max_num_seqs=st.integers(1, 4), seed=st.integers(0, 99))
def test_the_policy_feeding_any_part_of_the_drafts_keeps_the_references_tokens(reference, workload, k, blocks,
                                                                               budget, max_num_seqs, seed):
    prompts, params = workload
    with pytest.MonkeyPatch.context() as mp:
        llm, checked = adaptive_llm(Jitter(seed), mp, {"method": "ngram", "num_speculative_tokens": k,
                                                       "prompt_lookup_min": 1, "prompt_lookup_max": 3},
                                    blocks=blocks, budget=max(budget, max_num_seqs, k + 1), max_num_seqs=max_num_seqs)
    same_outputs(llm.generate(prompts, params), reference.generate(prompts, params))
    policy = llm.engine.scheduler.policy
    assert policy.counts["fed"] == llm.spec_stats.drafted <= policy.counts["proposed"]


def test_dear_rows_feed_nothing_free_rows_feed_every_proposal(reference, monkeypatch):
    prompts = [[5, 6, 7, 8] * 5, [9, 10] * 8, [11, 12, 13] * 4]
    params = {"temperature": 0, "max_tokens": 30, "ignore_eos": True}
    expected = reference.generate(prompts, params)
    llm, _ = adaptive_llm(Curve(0.0, 1.0), monkeypatch)
    same_outputs(llm.generate(prompts, params), expected)
    policy = llm.engine.scheduler.policy
    assert policy.counts["proposed"] > 20 and llm.spec_stats.drafted == 0
    assert policy.acceptance(type("S", (), {"seq_id": -1})(), "NgramProposer") > 0.5  # scored though never fed
    llm, _ = adaptive_llm(Curve(1.0, 0.0), monkeypatch)
    same_outputs(llm.generate(prompts, params), expected)
    policy = llm.engine.scheduler.policy
    assert llm.spec_stats.drafted == policy.counts["proposed"] > 20 and llm.spec_stats.accepted > 0


def test_the_default_policy_is_adaptive_and_calibrated_at_start(reference):
    llm, _ = spec_llm({"method": "ngram", "num_speculative_tokens": 4})
    policy = llm.engine.scheduler.policy
    assert isinstance(policy, cost_model.AdaptiveDrafts) and policy.cost.lines  # measured before any request
    prompts, params = [[5, 6, 7, 5, 6, 7, 5, 6]], {"temperature": 0, "max_tokens": 20, "ignore_eos": True}
    same_outputs(llm.generate(prompts, params), reference.generate(prompts, params))
    assert policy.counts["proposed"] > 0
    llm, _ = spec_llm({"method": "ngram", "num_speculative_tokens": 4, "enable_adaptive_verification": False})
    assert llm.engine.scheduler.policy is None


def test_a_policy_flag_that_is_not_a_bool_is_refused_naming_the_key():
    with pytest.raises(InvalidParam) as e:
        spec_llm({"method": "ngram", "num_speculative_tokens": 2, "enable_adaptive_verification": "yes"})
    assert e.value.param == "speculative_config.enable_adaptive_verification"
    assert "enable_adaptive_verification" in str(e.value)


def test_a_request_aborted_between_steps_leaves_nothing_in_the_policy():
    """Clients that leave once their request has an acceptance of its own: 10 of them, and the policy keeps none."""
    from common import SamplingParams
    llm, _ = spec_llm({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                       "prompt_lookup_max": 3})
    policy = llm.engine.scheduler.policy
    for _ in range(10):
        stream = llm.add_request([5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(max_tokens=40, temperature=0))
        reader = iter(llm.read(stream))
        for _ in range(6):  # a few steps: the first drafts come once the output repeats
            next(reader)
        assert len(policy.own) == 1
        llm.abort(stream.request_id)
    llm.generate([[5, 6]], SamplingParams(max_tokens=2))  # one more request: the queued aborts are applied
    assert policy.own == {} and llm.engine.scheduler.running == []

"""Stage 06's early-exit draft (``draft_num_layers``): the int4 copy cut to its first N layers and its head.

Oracles: the reference's tokens whatever the cut draft proposes (greedy and seeded, stops, n > 1, preemption,
prefix hits); the cut draft's guesses against a checkpoint that really has N layers (its folder written here, loaded
by the reference, one request at a time); its size against its config; the policy's pricing against a brute-force
search over how many drafts one request makes, each costing a pass of the draft.
"""
import importlib
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file, save_file

from common import ReferenceLLM, SamplingParams
from common.prepare import resolve_model
from common.validate import InvalidParam
from test_stage_06_adaptive import Curve, expected_tokens
from test_stage_06_speculative import (  # noqa: F401  (drafts_never_preempt: the autouse fixture, here too)
    ALWAYS, Recorder, drafts_checked_against, drafts_never_preempt, repetitive_workloads, same_outputs, spec_llm)
from workloads import examples

spec = importlib.import_module("stages.06_speculative")
cost_model = importlib.import_module("stages.speculative.cost_model")
engine = importlib.import_module("stages.speculative.engine")
EARLY = {"method": "draft_model", "num_speculative_tokens": 3, "draft_num_layers": 1}


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


def draft_of(llm):
    return llm.engine.scheduler.proposers[-1]


def test_the_cut_draft_holds_n_layers_and_a_kv_pool_for_n(reference):
    llm, _ = spec_llm({**EARLY, **ALWAYS}, blocks=16)
    full, _ = spec_llm({**EARLY, "draft_num_layers": None, **ALWAYS}, blocks=16)
    cut, whole = draft_of(llm), draft_of(full)
    layers = reference.config.num_hidden_layers
    assert layers == 2 and len(cut.model.layers) == cut.model.config.num_hidden_layers == 1
    assert len(whole.model.layers) == layers and len(llm.engine.model.layers) == layers  # the target: untouched
    assert cut.cache.k.shape[0] == cut.cache.v.shape[0] == 1 and whole.cache.k.shape[0] == layers
    assert cut.cache.k.shape[1:] == whole.cache.k.shape[1:]  # as many blocks as the engine's pool
    one_layer = sum(t.nbytes for t in whole.model.layers[1].values())
    assert cut.model.weight_bytes == whole.model.weight_bytes - one_layer  # the dropped layer is not held


def one_layer_folder(tmp_path):
    """The tiny checkpoint with only its first layer: config.json says 1, the safetensors hold layer 0 alone."""
    folder = tmp_path / "tiny-1-layer"
    shutil.copytree(resolve_model("tiny"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    for file in folder.glob("*.safetensors"):
        tensors = load_file(file)
        save_file({n: t for n, t in tensors.items() if not n.startswith("model.layers.1.")}, file)
    return folder


def test_the_cut_draft_drafts_what_an_n_layer_checkpoint_answers(reference, tmp_path):
    """Every draft is the greedy continuation of a real 1-layer int4 checkpoint (first layer, final norm, head),
    one request at a time: the cut keeps the right layers, and its N-layer KV cache is caught up and rolled back
    right. The target keeps the reference's tokens, under preemption, with n = 2 and seeded sampling."""
    oracle = ReferenceLLM(str(one_layer_folder(tmp_path)), dtype="bfloat16", quantization="int4")
    llm, checked, drafted = drafts_checked_against(oracle, reference, {**EARLY, **ALWAYS})
    assert sum(drafted) > 20 and checked.verify_steps > 0 and llm.stats.preemptions > 0


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=repetitive_workloads(), k=st.integers(1, 5), layers=st.integers(1, 2), blocks=st.integers(24, 80),
       budget=st.integers(8, 40), max_num_seqs=st.integers(1, 4), prefix=st.booleans(), adaptive=st.booleans())
def test_an_early_exit_draft_keeps_the_references_tokens_and_logprobs(reference, workload, k, layers, blocks, budget,
                                                                       max_num_seqs, prefix, adaptive):
    """Greedy and seeded sampling, penalties, stop ids, min_tokens, n > 1, a pool that preempts, prefix caching on
    or off, every draft fed or the policy's choice; drafts from the first 1 or 2 (all) layers."""
    prompts, params = workload
    expected = reference.generate(prompts, params)
    config = {**EARLY, "num_speculative_tokens": k, "draft_num_layers": layers,
              "enable_adaptive_verification": adaptive}
    llm, _ = spec_llm(config, blocks=blocks, budget=max(budget, max_num_seqs, k + 1), max_num_seqs=max_num_seqs,
                      enable_prefix_caching=prefix)
    same_outputs(llm.generate(prompts, params), expected)
    same_outputs(llm.generate(prompts, params), expected)  # again: prefix hits where caching is on
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and llm.stats.drafted_tokens == llm.spec_stats.drafted


def test_stops_and_eos_inside_early_exit_drafts_end_where_one_token_at_a_time_would(reference):
    """A stop string, a stop id, max_tokens and a sampled EOS while the cut draft drafts (every draft fed), each run
    twice (the second from the prefix cache): the kept run is cut at the reference's token."""
    prompt = [5, 6, 7, 8] * 2
    free = reference.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    ids = free.token_ids
    late = next(i for i, t in enumerate(ids) if i >= 4 and t not in ids[:i])  # a token first sampled late
    word = reference.tokenizer.decode([ids[late]])
    eos = SamplingParams(temperature=1.0, seed=1146, max_tokens=40)  # EOS at token 6 (test_stage_06_speculative)
    cases = [([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[word])),
             ([prompt], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[ids[late]])),
             ([prompt], SamplingParams(temperature=0, max_tokens=11, ignore_eos=True)),
             ([[40, 41, 42]], eos)]
    assert reference.generate([[40, 41, 42]], eos)[0].finish_reason == "stop"
    ended_in_a_verify = 0
    for prompts, params in cases:
        expected = reference.generate(prompts, params)
        llm, checked = spec_llm({**EARLY, "num_speculative_tokens": 6, **ALWAYS})
        steps = llm.add_observer(Recorder())
        for _ in range(2):
            same_outputs(llm.generate(prompts, params), expected)
        assert checked.verify_steps > 0
        ended_in_a_verify += sum(s.drafted > 0 for s in steps.seqs if s.finish_reason)
        assert llm.stats.prefix_hit_tokens > 0 or len(prompts[0]) < 8
    assert ended_in_a_verify > 0


# ---- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, says", [
    ({**EARLY, "draft_num_layers": 0}, "from 1 to"), ({**EARLY, "draft_num_layers": 3}, "give 1 to 2"),
    ({**EARLY, "draft_num_layers": 1.5}, "from 1 to"), ({**EARLY, "draft_num_layers": "1"}, "from 1 to"),
    ({**EARLY, "draft_num_layers": True}, "from 1 to"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_num_layers": 1}, "'draft_model' only"),
    ({"method": "suffix", "num_speculative_tokens": 2, "draft_num_layers": 1}, "'draft_model' only"),
])
def test_a_bad_draft_num_layers_is_refused_naming_the_key(config, says):
    with pytest.raises(InvalidParam) as e:
        spec.LLM("tiny", dtype="bfloat16", speculative_config=config)
    assert e.value.param == "speculative_config.draft_num_layers"
    assert "draft_num_layers" in str(e.value) and says in str(e.value)
    assert isinstance(e.value, ValueError)


# ---- the policy prices a draft model's passes -------------------------------------------------------------------
def measured(a, b):
    """A `PassCost` that measured passes of a + b * rows seconds (and one slowed by another process)."""
    cost = cost_model.PassCost()
    for rows in (1, 2, 4, 8):
        cost.observe(rows, a + b * rows)
        cost.observe(rows, a + b * rows + 0.5)
    return cost


@settings(max_examples=examples(300), deadline=None)
@given(alpha=st.floats(0, 1), n=st.integers(0, 8), a=st.floats(0.1, 5), b=st.floats(0, 2), pa=st.floats(0.001, 3),
       pb=st.floats(0, 1))
def test_one_requests_drafts_are_priced_at_its_draft_passes_by_brute_force(alpha, n, a, b, pa, pb):
    """One request: k drafts cost k passes of the draft (one row each) plus the verify step's k rows; the choice
    is the k with the most expected tokens per second."""
    step, passes = Curve(a, b), measured(pa, pb)
    assert passes.seconds(1) == pytest.approx(pa + pb) and passes.seconds(0) == 0
    ks = cost_model.best_drafts([alpha], [n], 1, 1, step, [passes])

    def rate(k):
        return expected_tokens(alpha, k) / (step.seconds(1, 1 + k) + k * (pa + pb))

    assert rate(ks[0]) == pytest.approx(max(rate(k) for k in range(n + 1)), rel=1e-6)


def test_a_cheaper_draft_drafts_more_and_a_draft_dearer_than_its_tokens_drafts_nothing():
    alphas, lengths, step = [0.8, 0.7, 0.9], [4, 4, 4], Curve(0.030, 0.001)  # a 30 ms step, 1 ms a row
    unpriced = cost_model.best_drafts(alphas, lengths, 3, 3, step)
    cheap = cost_model.best_drafts(alphas, lengths, 3, 3, step, [measured(0.002, 0.0001)] * 3)  # 4 of 30 layers
    dear = cost_model.best_drafts(alphas, lengths, 3, 3, step, [measured(0.025, 0.001)] * 3)  # all 30
    assert sum(unpriced) >= sum(cheap) > sum(dear)
    assert cost_model.best_drafts(alphas, lengths, 3, 3, step, [measured(1.0, 0.0)] * 3) == [0, 0, 0]
    assert cost_model.best_drafts(alphas, lengths, 3, 3, step, [None] * 3) == unpriced  # a lookup: free


class Fixed:
    """A draft's pass cost that stays what the test says (its passes' real times are ignored)."""

    def __init__(self, seconds):
        self.s = seconds

    def seconds(self, rows):
        return self.s if rows else 0.0

    def observe(self, *_):
        pass


def test_the_scheduler_asks_a_draft_only_for_drafts_worth_its_passes(reference, monkeypatch):
    """Rows free (a fixed step of 1 s): a draft whose pass costs 10 s is never asked, one of 1 ms is asked for its
    drafts; the tokens are the reference's both ways. The pass costs are measured from the start (calibration)."""
    prompts, params = [[5, 6, 7, 8] * 3, [9, 10] * 4], {"temperature": 0, "max_tokens": 16, "ignore_eos": True}
    expected = reference.generate(prompts, params)
    llm, _ = spec_llm(EARLY)
    assert draft_of(llm).pass_cost.points  # calibrated before the first request
    monkeypatch.setattr(engine, "speculative_policy", lambda config: cost_model.AdaptiveDrafts(Curve(1.0, 0.0)))
    for seconds, drafts in ((10.0, False), (0.001, True)):
        llm, _ = spec_llm(EARLY)
        draft_of(llm).pass_cost = Fixed(seconds)
        same_outputs(llm.generate(prompts, params), expected)
        assert (llm.engine.scheduler.policy.counts["proposed"] > 0) == drafts


def test_requests_that_each_fit_the_draft_pool_alone_but_not_together_still_get_the_references_tokens(reference):
    """hypothesis' example that found it: a 24-block pool, three samples of one prompt and three short requests.
    The draft checked each request's room alone, so one pass could take more blocks than were free; its requests
    then failed with "no free KV block" (the second run, when the samples' catch-ups meet)."""
    prompts = [[83, 83, 151, 792, 162] + [151] * 22, [151], [151] * 3, [151] * 6]
    params = [SamplingParams(max_tokens=23, temperature=0.5, seed=0, n=3),
              SamplingParams(max_tokens=8, temperature=0.5, seed=0)] + [SamplingParams(max_tokens=1, temperature=0.5,
                                                                                        seed=0)] * 2
    expected = reference.generate(prompts, params)
    llm, _ = spec_llm({**EARLY, "num_speculative_tokens": 1, **ALWAYS}, blocks=24, budget=36, max_num_seqs=4)
    for _ in range(2):
        same_outputs(llm.generate(prompts, params), expected)


def test_the_policy_explores_a_draft_model_until_its_acceptance_is_its_own(reference, monkeypatch):
    """Rows free and a draft pass 0.6 of a step: at the prior acceptance (0.5) one draft is worth 0.5 tokens for
    1.6 steps' time and would never be asked for, so the policy could never learn the draft's acceptance. It asks
    for one draft a request while exploring; tokens stay the reference's; a pass dearer than the step: not asked."""
    prompts, params = [[5, 6, 7, 8] * 3, [9, 10] * 4], {"temperature": 0, "max_tokens": 24, "ignore_eos": True}
    expected = reference.generate(prompts, params)
    monkeypatch.setattr(engine, "speculative_policy", lambda config: cost_model.AdaptiveDrafts(Curve(1.0, 0.0)))
    for seconds, asked in ((0.6, True), (2.0, False)):
        llm, _ = spec_llm({**EARLY, "draft_num_layers": 2})
        draft_of(llm).pass_cost = Fixed(seconds)
        policy = llm.engine.scheduler.policy
        assert policy.exploring("DraftModelProposer")
        same_outputs(llm.generate(prompts, params), expected)
        assert (policy.counts["proposed"] > 0) == asked
        if asked:
            assert not policy.exploring("DraftModelProposer")  # 2 requests x 24 tokens: enough drafts scored

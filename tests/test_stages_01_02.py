"""Stages 01 and 02 against the reference: same tokens for any workload; the toy run's step counts."""
import importlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams
from workloads import examples, workloads

STAGES = ["stages.01_static_batch", "stages.02_continuous_batch"]
TOY_LENGTHS = [62, 14, 15, 28, 98, 2, 28, 39]  # 286 tokens; the article's toy run totals


def stage_llm(name, model, **kw):
    return importlib.import_module(name).LLM(model, **kw)


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


@pytest.mark.parametrize("stage", STAGES)
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads(), max_num_seqs=st.integers(1, 6))
def test_same_tokens_as_reference(reference, stage, workload, max_num_seqs):
    prompts, params = workload
    expected = reference.generate(prompts, params)
    llm = stage_llm(stage, "tiny", dtype="bfloat16", max_num_seqs=max_num_seqs)
    got = llm.generate(prompts, params)
    for e, g in zip(expected, got):
        assert (g.token_ids, g.finish_reason) == (e.token_ids, e.finish_reason)
    assert llm.stats.output_tokens == sum(len(e.token_ids) for e in expected)


def test_toy_run_static_160_continuous_112_steps():
    prompts = [[100 + i, 200 + i] for i in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in TOY_LENGTHS]
    steps = {}
    for stage in STAGES:
        llm = stage_llm(stage, "tiny", max_num_seqs=4)
        outs = llm.generate(prompts, params)
        assert [len(o.token_ids) for o in outs] == TOY_LENGTHS
        steps[stage] = llm.stats.steps
        assert llm.stats.slot_steps_used == sum(TOY_LENGTHS)
    assert steps == {"stages.01_static_batch": 160, "stages.02_continuous_batch": 112}


@pytest.mark.parametrize("stage", STAGES)
def test_a_request_keeps_its_slot_on_the_timeline(stage):
    """The timeline draws each request in the KV slot it holds: when a neighbour finishes, nobody moves over."""
    prompts = [[100 + i, 200 + i] for i in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in TOY_LENGTHS]
    llm = stage_llm(stage, "tiny", max_num_seqs=4)
    llm.generate(prompts, params)
    places = {}
    for row in llm.stats.timeline:
        assert len(row) == 4
        for slot, request in enumerate(row):
            if request is not None:
                places.setdefault(request, set()).add(slot)
    assert sorted(places) == list(range(8)) and all(len(slots) == 1 for slots in places.values())
    # In stage 01 the short requests of a batch finish early and leave their slot empty until the batch ends.
    if stage == "stages.01_static_batch":
        assert any(None in row for row in llm.stats.timeline)


@pytest.mark.parametrize("stage", STAGES)
def test_bad_requests_fail_alone(reference, stage):
    good = SamplingParams(temperature=0, max_tokens=6)
    prompts = ["fine", "", [1, 5000], [7] * 5000, "also fine", "bad params"]
    params = [good, good, good, good, good, {"top_p": 0}]
    llm = stage_llm(stage, "tiny", max_num_seqs=2)
    outs = llm.generate(prompts, params)
    assert [o.finish_reason for o in outs] == ["length", "error", "error", "error", "length", "error"]
    for o, word in zip([outs[i] for i in (1, 2, 3, 5)], ["empty", "vocabulary", "max_model_len", "top_p"]):
        assert word in o.error
    ref = reference.generate(["fine", "also fine"], good)
    assert [outs[0].token_ids, outs[4].token_ids] == [r.token_ids for r in ref]


@pytest.mark.parametrize("stage", STAGES)
def test_kv_accounting(stage):
    llm = stage_llm(stage, "tiny", max_num_seqs=3, max_model_len=512)
    llm.generate([[5] * 40] * 5, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    per_token = llm.config.kv_bytes_per_token(2)
    st = llm.stats
    assert st.kv_bytes_used == 3 * 49 * per_token  # three sequences of 40 + 9 cached tokens at the peak
    if stage.endswith("continuous_batch"):
        assert st.kv_bytes_reserved == 3 * 512 * per_token  # max_model_len per slot
    else:
        assert st.kv_bytes_reserved == 3 * 50 * per_token  # the batch's longest request


REAL_PROMPTS = ["What is the capital of France?", "Write a limerick about a cat.",
                "List three prime numbers.", "Explain recursion to a child."]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.real_model
def test_real_model_same_tokens(stage):
    ref = ReferenceLLM(DEFAULT_MODEL, dtype="bfloat16")
    prompts = [ref.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in REAL_PROMPTS]
    params = [SamplingParams(temperature=0, max_tokens=24), SamplingParams(temperature=0.8, seed=1, max_tokens=24),
              SamplingParams(temperature=0, max_tokens=12), SamplingParams(temperature=1.0, top_p=0.9, seed=5,
                                                                           max_tokens=20)]
    expected = ref.generate(prompts, params)
    got = stage_llm(stage, DEFAULT_MODEL, max_num_seqs=3).generate(prompts, params)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]


def test_command_line_toy_run_side_by_side():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "stages.01_static_batch", "--toy"], cwd=root, text=True,
                         capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert out.returncode == 0, out.stderr
    assert "01 static: 160 steps, 354 of 640 slot-steps idle" in out.stdout
    assert "02 continuous: 112 steps, 162 of 448 slot-steps idle" in out.stdout

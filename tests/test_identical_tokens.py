"""The project's central promise: every stage gives every request exactly the reference's tokens.

One hypothesis workload runs through the reference and every stage, with whatever the stage
can vary (batch size, arrival order, KV budget small enough to preempt, block size, chunked
prefill, prefix caching). A failure prints the smallest workload that breaks it.

Every model an engine of this file asks for is loaded once per test and shared (`one_load_per_model`).
"""
import importlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common import engine_config
from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams
from workloads import TINY_VOCAB, checked_steps, examples, sampling_params

STAGES = ["stages.01_static_batch", "stages.02_continuous_batch", "stages.03_paged_kv", "stages.04_kernels",
          "stages.05_streaming"]
TINY_BYTES_PER_TOKEN = 512


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


@pytest.fixture(autouse=True)
def one_load_per_model(monkeypatch):
    """Each model the engines of one test ask for (its folder, dtype, device, class, batch invariance and
    quantization: every argument of the load) is loaded at the first request and handed to the later ones: the
    reference and stages 01-03 share one `Llama`, stages 04-05 one `KernelLlama`, across every hypothesis example.
    Loading (quantizing, the row-tile check) was most of this file's time: about 1-3 s of the real model's per
    engine against 0.2-0.7 s of generating (docs/measuring.md, round 4). A model is read-only once built (an
    engine's KV cache, scheduler and runner are its own, built around it), so each stage still runs its own
    assembly on the weights a load of its own would give. A test's models go with it (memory: one precision)."""
    loaded, load = {}, engine_config.load_model

    def shared(*args):
        if args not in loaded:
            loaded[args] = load(*args)
        return loaded[args]

    monkeypatch.setattr(engine_config, "load_model", shared)
    return loaded


@st.composite
def engine_workloads(draw):
    tokens = st.integers(3, TINY_VOCAB - 1)
    shared = draw(st.lists(tokens, max_size=40))
    n = draw(st.integers(1, 7))
    prompts = [(shared if draw(st.booleans()) else []) + draw(st.lists(tokens, min_size=1, max_size=50))
               for _ in range(n)]
    params = [draw(sampling_params(max_tokens=st.integers(1, 30))) for _ in range(n)]
    order = draw(st.permutations(range(n)))
    knobs = {"max_num_seqs": draw(st.integers(1, 5)), "block_size": draw(st.sampled_from([2, 16])),
             "spare_blocks": draw(st.integers(0, 12)), "token_budget": draw(st.integers(0, 40)),
             "enable_prefix_caching": draw(st.booleans())}
    return prompts, params, order, knobs


def build(stage, model, dtype, knobs, prompts, params, quantization=None):
    kw = {"dtype": dtype, "max_num_seqs": knobs["max_num_seqs"], "quantization": quantization}
    if stage >= "stages.03":
        bs = knobs["block_size"]
        need = max(-(-(len(p) + sp.max_tokens) // bs) for p, sp in zip(prompts, params))
        per_token = TINY_BYTES_PER_TOKEN if model == "tiny" else 23_040 * (2 if dtype == "float32" else 1)
        kw.update(block_size=bs, kv_cache_memory=(need + knobs["spare_blocks"]) * bs * per_token,
                  max_num_batched_tokens=knobs["max_num_seqs"] + knobs["token_budget"],
                  enable_prefix_caching=knobs["enable_prefix_caching"])
    return importlib.import_module(stage).LLM(model, **kw)


def run_in_order(llm, prompts, params, order):
    """Submit in ``order`` (arrival order), return outputs in the original order."""
    outs = llm.generate([prompts[i] for i in order], [params[i] for i in order])
    result = [None] * len(prompts)
    for pos, i in enumerate(order):
        result[i] = outs[pos]
    if hasattr(llm, "shutdown"):
        llm.shutdown()
    return result


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=engine_workloads())
def test_every_stage_gives_the_reference_tokens(reference, workload):
    prompts, params, order, knobs = workload
    expected = [(e.token_ids, e.finish_reason) for e in reference.generate(prompts, params)]
    for stage in STAGES:
        with checked_steps() as violations:  # stages 03-05: every step within its token budget
            got = run_in_order(build(stage, "tiny", "bfloat16", knobs, prompts, params), prompts, params, order)
        assert [(g.token_ids, g.finish_reason) for g in got] == expected, stage
        assert not violations, (stage, violations[:3])


@pytest.mark.parametrize("dtype, quantization", [("bfloat16", None), ("float32", None), ("bfloat16", "int8"),
                                                  ("bfloat16", "int4"), ("bfloat16", "w4a8")])
@pytest.mark.real_model
def test_real_model_every_stage(dtype, quantization, one_load_per_model):
    """SmolLM2 itself, in each precision: greedy, top-k and top-p with a stop string, arrivals out of order."""
    ref = ReferenceLLM(DEFAULT_MODEL, dtype=dtype, quantization=quantization)
    chat = lambda q: ref.tokenizer.apply_chat_template([{"role": "user", "content": q}])  # noqa: E731
    prompts = [chat("Name a primary colour."), chat("What is 2 + 2?"), chat("Write a short greeting.")]
    params = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(temperature=0.8, top_k=50, seed=11,
                                                                           max_tokens=12),
              SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=10, stop=["!"])]
    expected = [e.token_ids for e in ref.generate(prompts, params)]
    knobs = {"max_num_seqs": 2, "block_size": 16, "spare_blocks": 0, "token_budget": 24,
             "enable_prefix_caching": True}
    for stage in STAGES:
        llm = build(stage, DEFAULT_MODEL, dtype, knobs, prompts, params, quantization)
        assert llm.quantization == quantization
        got = run_in_order(llm, prompts, params, [2, 0, 1])
        assert [g.token_ids for g in got] == expected, stage
    assert len(one_load_per_model) == 2  # the loads went through the shared loader: a Llama and a KernelLlama


@pytest.fixture(scope="module", params=["int8", "int4", "w4a8"])
def quantized_reference(request):
    return ReferenceLLM("tiny", dtype="bfloat16", quantization=request.param)


@settings(max_examples=examples(8), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=engine_workloads())
def test_every_stage_gives_the_reference_tokens_quantized(quantized_reference, workload):
    """Identical tokens hold within a precision: int8, int4 and w4a8, every stage against the reference."""
    prompts, params, order, knobs = workload
    q = quantized_reference.quantization
    expected = [(e.token_ids, e.finish_reason) for e in quantized_reference.generate(prompts, params)]
    for stage in STAGES:
        got = run_in_order(build(stage, "tiny", "bfloat16", knobs, prompts, params, q), prompts, params, order)
        assert [(g.token_ids, g.finish_reason) for g in got] == expected, (stage, q)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device: the GPU path is checked where "
                    "one is present (python -m stages.04_kernels --gpu-check runs this test too)")
@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
@pytest.mark.parametrize("model", ["tiny", pytest.param(DEFAULT_MODEL, marks=pytest.mark.real_model)])
def test_every_stage_on_cuda_gives_the_same_tokens(model, quantization):
    """On CUDA (device='auto' picks it) every stage, stage 04's Triton kernels included, gives the reference's
    tokens: chunked prefill, preemption and a shared prefix in the mix; quantized, on quant_cuda.py's kernels."""
    ref = ReferenceLLM(model, dtype="bfloat16", device="cuda", quantization=quantization)
    prompts = [list(range(3 + i, 40 + 7 * i)) for i in range(6)] + [list(range(3, 40))]
    params = [SamplingParams(temperature=0 if i % 2 else 0.8, seed=i, max_tokens=24, ignore_eos=True) for i in range(7)]
    expected = [e.token_ids for e in ref.generate(prompts, params)]
    knobs = {"max_num_seqs": 3, "block_size": 16, "spare_blocks": 2, "token_budget": 20, "enable_prefix_caching": True}
    for stage in STAGES:
        llm = build(stage, model, "bfloat16", knobs, prompts, params, quantization)
        assert llm.device.type == "cuda" and llm.quantization == quantization
        got = run_in_order(llm, prompts, params, list(reversed(range(7))))
        assert [g.token_ids for g in got] == expected, stage

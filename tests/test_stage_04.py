"""Stage 04: the reference's tokens on CPU (torch path), and the kernel path itself, interpreted."""
import dataclasses
import functools
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM, SamplingParams
from workloads import checked_steps, examples, workloads

kernels = importlib.import_module("stages.04_kernels")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reference():
    return ReferenceLLM("tiny", dtype="bfloat16")


@functools.cache
def tiny_config():
    """The tiny model's config, read once: the kernel tests below need its shapes, not a model loaded per example."""
    return ReferenceLLM("tiny").config


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads(), max_num_seqs=st.integers(1, 6), kv_blocks=st.integers(0, 20))
def test_same_tokens_as_reference_on_cpu(reference, workload, max_num_seqs, kv_blocks):
    prompts, params = workload
    need = max(-(-(len(p) + sp.max_tokens) // 16) for p, sp in zip(prompts, params))
    llm = kernels.LLM("tiny", max_num_seqs=max_num_seqs, kv_cache_memory=(need + kv_blocks) * 16 * 512,
                      max_num_batched_tokens=max_num_seqs + 32)
    assert "fused CPU kernels" in llm.execution_path
    with checked_steps() as violations:
        got = llm.generate(prompts, params)
    assert not violations, violations[:3]
    expected = reference.generate(prompts, params)
    assert [(g.token_ids, g.finish_reason) for g in got] == [(e.token_ids, e.finish_reason) for e in expected]


def test_kernel_path_end_to_end_interpreted(monkeypatch):
    """The CUDA code path (fused norms, RoPE, SwiGLU, KV store) run through the Triton interpreter on the tiny
    model in float32 gives the reference's tokens. With fused_attention the decode-attention kernel runs too:
    its arithmetic is not the reference's, so only the first token of each request (from the prefill, which keeps
    the reference attention) is promised."""
    monkeypatch.setenv("STEPWISE_FORCE_KERNELS", "1")
    prompts = [[5, 6, 7], list(range(40, 70)), [900, 3]]  # the third joins while the first two decode
    params = [SamplingParams(temperature=0, max_tokens=5), SamplingParams(temperature=0.9, seed=4, max_tokens=4),
              SamplingParams(temperature=0, max_tokens=6)]
    exact = kernels.LLM("tiny", dtype="float32", max_num_seqs=2, max_num_batched_tokens=16)
    fused = kernels.LLM("tiny", dtype="float32", max_num_seqs=2, max_num_batched_tokens=16, fused_attention=True)
    assert exact.model.use_kernels and exact.engine.cache.use_kernels and not exact.engine.cache.fused_attention
    assert fused.engine.cache.fused_attention
    got, got_fused = exact.generate(prompts, params), fused.generate(prompts, params)
    monkeypatch.delenv("STEPWISE_FORCE_KERNELS")
    expected = ReferenceLLM("tiny", dtype="float32").generate(prompts, params)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert [g.token_ids[0] for g in got_fused] == [e.token_ids[0] for e in expected]
    assert [len(g.token_ids) for g in got_fused] == [len(e.token_ids) for e in expected]


def test_command_line_says_which_path_it_took():
    out = subprocess.run([sys.executable, "-m", "stages.04_kernels", "--toy"], cwd=ROOT, text=True,
                         capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert out.returncode == 0, out.stderr
    assert "stage 04 path: fused CPU kernels" in out.stdout
    assert "04 kernels: 112 steps" in out.stdout


def test_gpu_check_refuses_without_cuda():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run the check itself")
    out = subprocess.run([sys.executable, "-m", "stages.bench.gpu_check"], cwd=ROOT, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 2 and "needs a CUDA device" in out.stdout


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.real_model
def test_fused_cpu_kernels_give_the_reference_bits(dtype):
    """The fused C++ kernels against common.numerics.ops' eager functions: hidden states and logits bit for bit,
    on the real model, for a step that mixes a prefill chunk with decodes."""
    import torch

    from common.kv_cache import ContiguousKVCache
    from common.loader import load_model
    from common.prepare import resolve_model
    from stages import __name__ as _  # noqa: F401
    kernel_model = importlib.import_module("stages.kernels.model")
    folder = resolve_model(DEFAULT_MODEL)
    reference = load_model(folder, dtype)
    fused = load_model(folder, dtype, model_class=kernel_model.KernelLlama)
    assert fused.fused is not None
    lens, ctx = [37, 1, 1, 5], [37, 60, 9, 20]
    ids = torch.randint(0, 49152, (sum(lens),), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(c - n, c) for n, c in zip(lens, ctx)])
    results = []
    for model in (reference, fused):
        cache = ContiguousKVCache(model.config, 4, 64, model.dtype, model.device)
        cache.prepare([0, 1, 2, 3], lens, ctx)
        hidden = model.forward(ids, positions, cache)
        results.append((hidden, model.compute_logits(hidden)))
    assert fused.fused.calls > 0
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("native", [True, False], ids=["compiled-attention", "tensor-op-attention"])
def test_a_decode_step_runs_the_same_tensor_operations_at_any_context_length(native, monkeypatch):
    """The fusion report's counter on stage 03's step: attention is a fixed number of operations per layer, so
    a step at ~20 tokens of context and one at ~90 (a second 64-key tile) run the same operations."""
    from common.numerics import native as compiled
    if native and not compiled.load():
        pytest.skip(f"the CPU attention kernel {compiled.build_note()}")
    monkeypatch.setenv("STEPWISE_NATIVE_ATTENTION", "1" if native else "0")
    report = importlib.import_module("stages.bench.fusion_report")
    short, long = (report.decode_step_counts("stages.03_paged_kv", 4, context, model="tiny") for context in (20, 90))
    assert short["ops"] == long["ops"] > 0 and short["by_op"] == long["by_op"]
    assert long["bytes"] > short["bytes"]  # more keys are read, by the same operations
    layers = tiny_config().num_hidden_layers
    if native:  # per layer: one kernel call
        assert short["by_op"]["attention"] == layers and "bmm" not in short["by_op"]
    else:  # per layer: one bmm for all scores, one for all P·V
        assert short["by_op"]["bmm"] == 2 * layers



def test_the_fusion_count_sees_each_compiled_kernel_call_once():
    """The compiled kernels are bound to Python outside the dispatcher's sight: the counter must still count each
    call as one operation, and never the allocations a kernel makes inside or the counter's own bookkeeping."""
    from common.numerics import native
    fused_source = importlib.import_module("stages.kernels.cpu_fusion").SOURCE
    if not native.load(fused_source):
        pytest.skip(f"the fused CPU kernels {native.build_note(fused_source)}")
    report = importlib.import_module("stages.bench.fusion_report")
    counts = report.decode_step_counts("stages.04_kernels", 4, 20, model="tiny")
    by_op, layers = counts["by_op"], tiny_config().num_hidden_layers
    assert not {"empty", "empty_like", "empty_strided", "zeros"} & set(by_op), by_op
    assert by_op["fused rope_qk_store"] == by_op["fused swiglu"] == layers
    if native.load():
        assert by_op["attention"] == layers
    if native.linear_kernel():  # our kernels take any call whole: q/k/v, o, gate/up, down per layer, LM head
        assert by_op["linear"] == 4 * layers + 1

@settings(max_examples=examples(40), deadline=None)
@given(rows=st.integers(1, 70), hidden=st.sampled_from([192, 576, 2048]),
       dtype=st.sampled_from(["bfloat16", "float32"]),
       scale=st.sampled_from([1e-3, 1.0, 60.0]), heads=st.sampled_from([(9, 3), (6, 2), (4, 4), (32, 8)]),
       seed=st.integers(0, 2**32 - 1))
def test_fused_cpu_kernels_match_common_ops_bit_for_bit(rows, hidden, dtype, scale, heads, seed):
    """The C++ kernels against the functions they fuse (common.numerics.ops), on drawn data: every bit. 2,048 wide
    and 32 + 8 heads are the 1B shape's, whose rows split over threads from a few rows up (cpu_kernels.cpp's
    row_grain), so a row's bits are checked whichever thread's share it falls in."""
    import torch

    from common.numerics import ops
    cpu_fusion = importlib.import_module("stages.kernels.cpu_fusion")
    config = tiny_config()
    fused = cpu_fusion.FusedCPU(config, getattr(torch, dtype))
    gen = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    x = (torch.randn(rows, hidden, generator=gen) * scale).to(dt)
    residual = torch.randn(rows, hidden, generator=gen).to(dt)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dt)
    eps = config.rms_norm_eps
    for got, want in zip(fused.add_rms_norm(x, residual, weight), ops.add_rms_norm(x, residual, weight, eps)):
        assert torch.equal(got, want)
    nq, nkv = heads
    d = 64
    fused.config = dataclasses.replace(config, num_attention_heads=nq, num_key_value_heads=nkv, head_dim=d)
    qkv = (torch.randn(rows, (nq + 2 * nkv) * d, generator=gen) * scale).to(dt)
    angles = torch.randint(0, 4096, (rows, 1), generator=gen) * (1e4 ** -(torch.arange(0, d, 2) / d))
    cos, sin = ops.rope_tables(angles.cos(), angles.sin())
    for got, want in zip(fused.rope_qkv(qkv, cos, sin), ops.rope_qkv(qkv, cos, sin, nq, nkv)):
        assert torch.equal(got, want)
    # RoPE with the KV write fused: the cache rows end as rope_qkv followed by index_copy_ leaves them.
    q, k, v = ops.rope_qkv(qkv, cos, sin, nq, nkv)
    write_rows = torch.randperm(rows * nkv + 5, generator=gen)[:rows * nkv].view(rows, nkv)
    k_rows, v_rows = torch.randn(2, rows * nkv + 5, d, generator=gen).to(dt)
    want_k, want_v = k_rows.clone(), v_rows.clone()
    want_k.index_copy_(0, write_rows.view(-1), k.reshape(-1, d))
    want_v.index_copy_(0, write_rows.view(-1), v.reshape(-1, d))
    assert torch.equal(fused.rope_qk_store(qkv, cos, sin, k_rows, v_rows, write_rows), q)
    assert torch.equal(k_rows, want_k) and torch.equal(v_rows, want_v)
    with pytest.raises(RuntimeError, match="outside the cache"):
        fused.rope_qk_store(qkv, cos, sin, k_rows, v_rows, write_rows + rows * nkv + 5)
    gate_up = (torch.randn(rows, 2 * hidden, generator=gen) * scale).to(dt)
    assert torch.equal(fused.swiglu(gate_up), ops.swiglu(gate_up))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fused_swiglu_gives_torchs_bits_for_every_gate_value(dtype):
    """The table-driven SwiGLU kernel against torch's silu and multiply (common.numerics.ops.swiglu) on all 65,536 gate
    values at once, each times three different ups: every bit (a NaN may be any NaN)."""
    import torch

    from common.numerics import ops
    cpu_fusion = importlib.import_module("stages.kernels.cpu_fusion")
    dt = getattr(torch, dtype)
    fused = cpu_fusion.FusedCPU(tiny_config(), dt)
    assert fused.silu_table is not None and "4 C++ kernels" in fused.note
    bits = torch.arange(1 << 16, dtype=torch.int32)
    gates = torch.where(bits >= 1 << 15, bits - (1 << 16), bits).to(torch.int16).view(dt).view(64, 1024)
    for up in (torch.ones(64, 1024), torch.full((64, 1024), -1.37), torch.randn(64, 1024)):
        gate_up = torch.cat([gates, up.to(dt)], 1)
        got, want = fused.swiglu(gate_up), ops.swiglu(gate_up)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[~got.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))

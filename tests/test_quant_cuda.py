"""The quantized linears' CUDA path (numerics/quant_cuda.py): Triton, interpreted here on CPU (TRITON_INTERPRET=1,
set in conftest) or compiled on a GPU. Oracles: torch's float32 matmul on the dequantized weights, gguf's own Q4_1
decoder, and a row's bits alone. (The sm_90 compile of both kernels is in tests/test_kernels.py.)"""
import importlib

import numpy as np
import pytest
import torch

from common import ReferenceLLM, SamplingParams
from common.numerics import int4, int8
from common.kv_cache import ContiguousKVCache
from common.numerics.int4 import Int4Linear, q4_1_groups, q4_1_quantize
from common.numerics.int8 import Int8Linear

pytest.importorskip("triton")
qc = importlib.import_module("common.numerics.quant_cuda")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter truncates float32 -> bfloat16 stores: up to one bfloat16 step (2^-7 relative) off.
CLOSE = dict(rtol=1.6e-2, atol=1.6e-2)


def weights(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * 0.05 + torch.randn(shape[0], 1, generator=gen) * 0.02


def rows(n, k, seed=7):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEVICE)


@pytest.mark.parametrize("shape, n_rows", [((64, 96), 1), ((80, 64), 19), ((128, 32), 16)])
def test_int8_kernel_is_the_scaled_integer_product(shape, n_rows):
    w = weights(shape, 1)
    linear = Int8Linear(w)
    q, scale = linear.qweight, linear._scales_f32
    x = rows(n_rows, shape[1])
    got = qc.int8_linear(x, q.to(DEVICE), scale.to(DEVICE))
    expected = (x.float() @ q.float().t().to(DEVICE)) * scale.to(DEVICE)
    assert got.dtype == torch.bfloat16 and got.shape == (n_rows, shape[0])
    torch.testing.assert_close(got.float(), expected, **CLOSE)


@pytest.mark.parametrize("shape, n_rows", [((64, 96), 1), ((48, 128), 17)])
def test_int4_kernel_multiplies_by_the_ggufs_own_weights(shape, n_rows):
    import gguf

    blocks = q4_1_quantize(weights(shape, 2))
    codes, d, m = q4_1_groups(blocks)
    nibbles = qc.q4_1_nibbles(codes)
    # The kernel reads the GGUF's bytes as they are: 16 bytes of nibbles after each block's d and m.
    assert np.array_equal(nibbles.numpy().reshape(shape[0], -1, 16), blocks.reshape(shape[0], -1, 20)[..., 4:])
    w = torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1)).to(DEVICE)
    x = rows(n_rows, shape[1])
    got = qc.int4_linear(x, nibbles.to(DEVICE), torch.from_numpy(d).to(DEVICE), torch.from_numpy(m).to(DEVICE))
    torch.testing.assert_close(got.float(), x.float() @ w.t(), **CLOSE)
    if DEVICE == "cuda":  # unrounded d and m: dequantized() is the GGUF's weights exactly
        assert torch.equal(Int4Linear(codes, d, m, device=DEVICE).dequantized(), w)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("n_rows", [2, 16, 17, 33])
def test_a_rows_bits_do_not_depend_on_the_other_rows(kind, n_rows):
    shape = (96, 64)
    x = rows(n_rows, shape[1], seed=n_rows)
    if kind == "int8":
        lin = Int8Linear(weights(shape, 3))
        args = (lin.qweight.to(DEVICE), lin._scales_f32.to(DEVICE))
        fn = qc.int8_linear
    else:
        codes, d, m = q4_1_groups(q4_1_quantize(weights(shape, 3)))
        args = (qc.q4_1_nibbles(codes).to(DEVICE), torch.from_numpy(d).to(DEVICE), torch.from_numpy(m).to(DEVICE))
        fn = qc.int4_linear
    batched = fn(x, *args)
    for r in sorted({0, n_rows // 2, n_rows - 1}):
        assert torch.equal(fn(x[r:r + 1], *args)[0], batched[r]), r
    shuffled = torch.randperm(n_rows, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fn(x[shuffled], *args), batched[shuffled])


def prompt_logits(model, prompt):
    cache = ContiguousKVCache(model.config, 1, len(prompt), model.dtype, model.device, True)
    cache.prepare([0], [len(prompt)], [len(prompt)])
    return model.compute_logits(model.forward(torch.tensor(prompt), torch.arange(len(prompt)), cache))


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU test_every_stage_on_cuda_gives_the_same_tokens runs this path")
@pytest.mark.parametrize("q", ["int8", "int4"])
def test_a_quantized_model_on_the_triton_path_gives_the_reference_tokens(monkeypatch, tmp_path, tiny_folder, q):
    """The whole CUDA code path of a quantized model (Triton linears for every projection and the LM head, the
    int8 token table read by the embedding) interpreted on the tiny model: its logits are close to the CPU
    kernels' and stage 05 gives the reference's tokens on it. Interpreted kernels are slow (about a second a
    step), so two short requests, and the row-tile check (minutes interpreted) is replaced by a tile of 16: the
    rows' independence is checked directly by test_a_rows_bits_do_not_depend_on_the_other_rows."""
    cpu_model = ReferenceLLM(str(tiny_folder), dtype="bfloat16", quantization=q, device="cpu").model
    for module in (int8, int4):
        monkeypatch.setattr(module, "cuda_kernels", lambda device: qc)
    monkeypatch.setattr("common.numerics.invariant.home", lambda: tmp_path)
    monkeypatch.setattr("common.numerics.invariant.find_row_tile", lambda *args: 16)
    ref = ReferenceLLM(str(tiny_folder), dtype="bfloat16", quantization=q, device="cpu")
    linears = [ref.model.lm_head] + [layer[n] for layer in ref.model.layers for n in ("qkv", "o", "gate_up", "down")]
    assert all(lin.backend.startswith("Triton") for lin in linears)

    logits, cpu_logits = (prompt_logits(m, [5, 9, 300, 17]) for m in (ref.model, cpu_model))
    # bfloat16 activations rounded at other points (and truncated by the interpreter) drift a little over the
    # layers: within 2% of the largest logit (one bfloat16 step there is 0.8%); a wrong scale, group or nibble
    # order is off by the logits' own size.
    assert (logits - cpu_logits).abs().max() <= 0.02 * cpu_logits.abs().max()

    prompts = [[5, 6, 7], list(range(40, 47))]
    params = [SamplingParams(temperature=0, max_tokens=3), SamplingParams(temperature=0.9, seed=3, max_tokens=2)]
    expected = [o.token_ids for o in ref.generate(prompts, params)]
    stage = importlib.import_module("stages.05_streaming").LLM(str(tiny_folder), dtype="bfloat16", quantization=q,
                                                               max_num_seqs=2)
    assert stage.model.lm_head.backend.startswith("Triton")
    assert [o.token_ids for o in stage.generate(prompts, params)] == expected

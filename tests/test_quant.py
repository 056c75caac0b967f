"""Quantized linears (numerics/int8.py, int4.py): conventions, batch invariance, the GGUF's 4-bit groups."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors import safe_open

from common.paths import DEFAULT_MODEL
from common import ReferenceLLM
from common.numerics.invariant import CANDIDATE_TILES, ROW_TILE, choose_row_tile
from common.numerics.int4 import Int4Linear, q4_1_groups, q4_1_quantize
from common.numerics.int8 import Int8Linear
from common.numerics.quant import GROUP_SIZE, Q4_1_SUFFIX, precision_bytes
from workloads import examples

SMOLLM2_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down: [out, in]


def random_q4_1(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen) * 0.05 + torch.randn(shape[0], 1, generator=gen) * 0.02
    return q4_1_quantize(w)


def kernel_weights(blocks: np.ndarray) -> torch.Tensor:
    """What the int4 kernel must multiply by, from the Q4_1 blocks, written independently of common.numerics.quant:
    w = d * q + m becomes (q - 8) * scale + zero with scale = d, zero = m + 8 d, each rounded to bfloat16."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 20)
    d = torch.from_numpy(b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    m = torch.from_numpy(b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
    q = torch.from_numpy(np.concatenate([b[..., 4:] & 15, b[..., 4:] >> 4], -1).astype(np.float32))  # [rows, g, 32]
    scale = d.to(torch.bfloat16).float()[..., None]
    zero = (m + 8 * d).to(torch.bfloat16).float()[..., None]
    return ((q - 8) * scale + zero).reshape(rows, -1)


def test_q4_1_groups_decode_like_gguf():
    import gguf

    blocks = random_q4_1((64, 96), 0)
    codes, d, m = q4_1_groups(blocks)
    expected = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1)
    got = codes.reshape(64, -1, 32) * d[..., None].astype(np.float32) + m[..., None].astype(np.float32)
    np.testing.assert_array_equal(got.reshape(64, 96), expected)
    assert codes.min() == 0 and codes.max() == 15


def gguf_weights(blocks: np.ndarray) -> torch.Tensor:
    """The GGUF's own weights, d * q + m in float32, as gguf-py (and so transformers) dequantizes them."""
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1).copy())


@pytest.mark.parametrize("ours", [True, False], ids=["our kernel", "torch's kernel"])
@pytest.mark.parametrize("shape", [(64, 96), (48, 128)])
def test_int4_kernel_multiplies_by_the_q4_1_weights(shape, ours):
    """Ours (AMX, AVX-512) keeps the GGUF's codes, d and m exactly; torch's its own convention (kernel_weights)."""
    blocks = random_q4_1(shape, 1)
    linear = Int4Linear.from_q4_1(blocks, plain=not ours)
    if ours and linear.records is None:
        pytest.skip("our int4 kernels need AMX or AVX-512 BF16")
    w = gguf_weights(blocks) if ours else kernel_weights(blocks)
    # Read back through the kernel's own storage: d, m and the order of the codes are as intended.
    torch.testing.assert_close(linear.dequantized(), w, rtol=0, atol=0)
    x = torch.randn(ROW_TILE, shape[1], generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    torch.testing.assert_close(linear(x).float(), x.float() @ w.t(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape", [(16, 32), (16, 160), (48, 96), (960, 576), (576, 1536)])
def test_int4_one_row_gets_its_bits_in_every_batch(shape):
    """Our int4 kernel takes a row alone (a decode step) through its own path (several groups per tile round
    trip) and batches through another (one group per round trip): a row's bits must not tell them apart. The
    shapes cover one block of 16 outputs, an odd number of blocks, a single group, and group counts that leave a
    partial round."""
    linear = Int4Linear.from_q4_1(random_q4_1(shape, 6))
    if linear.records is None:
        pytest.skip("our int4 kernels need AMX or AVX-512 BF16")
    x = (torch.randn(40, shape[1], generator=torch.Generator().manual_seed(7)) * 3).to(torch.bfloat16)
    alone = torch.cat([linear.kernel(x[i:i + 1]) for i in range(40)])
    for rows in (2, 3, 16, 17, 32, 33, 40):
        assert torch.equal(linear.kernel(x[:rows]), alone[:rows]), rows
    exact = x.double() @ linear.dequantized().double().t()
    assert ((alone.double() - exact).abs() <= exact.abs() / 128 + 1e-2).all()  # one bfloat16 rounding, give or take


def test_int8_is_per_channel_symmetric():
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.01, 1, 96)[:, None]
    linear = Int8Linear(w)
    assert linear.qweight.dtype == torch.int8 and linear.qweight.abs().max() <= 127
    assert linear.scales.shape == (96,) and linear.scales.dtype == torch.bfloat16
    assert (linear.qweight.abs().amax(1) >= 126).all()  # each row uses its whole range: one scale per row
    err = (linear.dequantized() - w).abs()
    assert (err <= linear.scales.float()[:, None] * 0.5 + 1e-6).all()  # round to nearest
    x = torch.randn(ROW_TILE, 64).to(torch.bfloat16)
    torch.testing.assert_close(linear(x).float(), x.float() @ linear.dequantized().t(), rtol=1e-2, atol=2e-2)


def kernels(shape, seed):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.05
    return {"int8": Int8Linear(w), "int4": Int4Linear.from_q4_1(q4_1_quantize(w))}


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_every_row_count_up_to_the_tile_gives_a_row_the_same_bits(kind):
    linear = kernels((64, 128), 4)[kind]
    note = choose_row_tile([linear], torch.bfloat16, torch.device("cpu"))
    assert "Int" in note and not linear.exact_tiles
    tile = linear.row_tile
    x = torch.randn(tile, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    alone = torch.cat([linear.kernel(x[i:i + 1]) for i in range(tile)])
    for rows in range(1, tile + 1):
        assert torch.equal(linear.kernel(x[:rows]), alone[:rows]), rows


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(1, 2 * max(CANDIDATE_TILES) + 9), st.integers(0, 10_000), st.sampled_from(SMOLLM2_SHAPES),
       st.sampled_from(["int8", "int4"]), st.integers(0, 2**16))
def test_quantized_row_does_not_depend_on_batch(rows, pick, shape, kind, seed):
    linear = kernels(shape, seed % 7)[kind]
    choose_row_tile([linear], torch.bfloat16, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, shape[1], generator=gen).to(torch.bfloat16)
    i = pick % rows
    batched = linear(x)
    assert batched.shape == (rows, shape[0])
    assert torch.equal(linear(x[i:i + 1])[0], batched[i])


def test_bad_requests_for_quantization_fail_clearly(tiny_folder):
    with pytest.raises(ValueError, match="int3"):
        ReferenceLLM(str(tiny_folder), quantization="int3")
    with pytest.raises(ValueError, match="bfloat16"):
        ReferenceLLM(str(tiny_folder), dtype="float32", quantization="int8")
    with pytest.raises(ValueError, match="multiple of 32"):
        Int8Linear(torch.randn(32, 40))


def test_model_sizes_match_the_arithmetic(tiny_folder):
    with safe_open(tiny_folder / "model.safetensors", "pt") as f:
        shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    for q in ["int8", "int4"]:
        model = ReferenceLLM(str(tiny_folder), quantization=q).model
        assert model.weight_bytes == precision_bytes(shapes, q)
    assert precision_bytes(shapes, "bfloat16") == ReferenceLLM(str(tiny_folder)).model.weight_bytes


@pytest.mark.real_model
def test_smollm2_sizes():
    """The figures `python -m common.prepare` prints: 269 MB at 16 bits; int8 and int4 with their scales."""
    from common.config import ModelConfig
    from common.loader import expected_shapes
    from common.prepare import resolve_model

    shapes = expected_shapes(ModelConfig.from_folder(resolve_model(DEFAULT_MODEL)))
    proj = sum(np.prod(s) for n, s in shapes.items() if n.endswith("_proj.weight"))  # 106,168,320
    table, rows, norms = 49152 * 576, 49152, 61 * 576
    assert precision_bytes(shapes, "bfloat16") == 2 * (proj + table + norms) == 269_030_016
    int8_rows = 30 * (960 + 576 + 3072 + 576)  # output channels of the projections, one bf16 scale each
    assert precision_bytes(shapes, "int8") == proj + 2 * int8_rows + table + 2 * rows + 2 * norms
    assert precision_bytes(shapes, "int4") == proj // 2 + proj // GROUP_SIZE * 4 + table + 2 * rows + 2 * norms


@pytest.mark.real_model
def test_prepared_q4_1_blocks_are_the_ggufs(real_folder):
    """The checkpoint keeps each projection's GGUF blocks; decoded, they are the dequantized float32 weights,
    rows un-permuted like them (Q and K)."""
    import gguf

    with safe_open(real_folder / "q4_1.safetensors", "pt") as f, \
            safe_open(real_folder / "model.safetensors", "pt") as g:
        assert len(list(f.keys())) == 30 * 7
        for name in ["model.layers.3.self_attn.q_proj", "model.layers.3.self_attn.k_proj",
                     "model.layers.29.mlp.down_proj"]:
            blocks = f.get_tensor(name + Q4_1_SUFFIX).numpy()
            dense = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1)
            np.testing.assert_array_equal(dense, g.get_tensor(name + ".weight").numpy())

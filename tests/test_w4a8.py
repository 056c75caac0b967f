"""w4a8 (int4 weights, activations rounded to int8 per group: numerics/native/linear_portable_w4a8.h): the kernel's
bits against its definition written in tensor ops (common/numerics/linear_reference.py), a row's bits alone and in a
call of any size, the result within its inputs' rounding of the int4 product it approximates, and refusals where it
cannot run. The kernel alone, on every ISA's instruction (VNNI, AVX2, NEON, scalar): `make native-check`."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from common.numerics import linear_reference as reference, native
from common.numerics.int4 import Int4Linear, q4_1_groups, q4_1_quantize
from common.numerics.quant import parse_quantization
from workloads import examples

pytestmark = pytest.mark.skipif(not native.w4a8_kernel(), reason="linear.cpp did not build here (no compiler?)")
SHAPES = [(960, 576), (576, 1536), (16, 32), (48, 64), (80, 96)]


def make(out_features: int, in_features: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5
    codes, d, m = q4_1_groups(q4_1_quantize(w))
    linear = Int4Linear(codes, d, m, activations=8)
    return linear, [torch.from_numpy(t.astype(np.float32)) for t in (codes, d, m)], gen


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([2.0 ** -120, 2.0 ** -90, 1e-2, 1.0, 30.0]), data=st.data())
def test_the_kernel_gives_the_bits_of_its_definition(rows, shape, seed, scale, data):
    """Every bit of a call of 1..40 rows, on some outputs (the last block's among them); groups of zeros, groups
    below the quantization's floor (2^-120: all zero), groups with one large input (the others round to 0 or 1
    step) and ties of x * 127 / amax (x a multiple of amax / 254) in the mix."""
    out_features, in_features = shape
    linear, (codes, d, m), gen = make(out_features, in_features, seed)
    assert linear.backend.startswith("W4A8 ")
    x = torch.randn(rows, in_features, generator=gen) * scale
    x[::4, :32] = 0
    x[1::5, 3] = 1000 * scale
    x[2::5, :32] = torch.randint(-127, 128, (len(range(2, rows, 5)), 32), generator=gen) * (scale / 254)
    x = x.bfloat16()
    got = linear.matmul(x)
    outputs = sorted({out_features - 1, *data.draw(st.lists(st.integers(0, out_features - 1), max_size=12))})
    expected = reference.w4a8(x.float(), codes[outputs], d[outputs], m[outputs])
    assert torch.equal(got[:, outputs].view(torch.int16), expected.view(torch.int16))
    i = data.draw(st.integers(0, rows - 1))
    assert torch.equal(linear.matmul(x[i:i + 1]).view(torch.int16), got[i:i + 1].view(torch.int16))


def test_the_definitions_rounding_follows_its_text():
    """linear_reference.quantize_rows against the stated rule, computed another way (numpy, one value at a time):
    a = nearbyint(x * (127 / amax)) with ties to even, s = amax / 127, all in float32."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 64, generator=gen)
    x[0, :32] = torch.arange(32) / 254 * 2 - 0.1  # ties of x * 127 / amax among them
    x[0, 5] = 1.0
    x[1, :32] = 2.0 ** -110
    a, s, ms = reference.quantize_rows(x)
    xs = x.numpy()
    for r in range(6):
        for g in range(2):
            group = xs[r, 32 * g:32 * g + 32]
            amax = np.float32(np.abs(group).max())
            if amax < np.float32(2.0 ** -100):
                assert s[r, g] == 0 and not a[r, 32 * g:32 * g + 32].any()
                continue
            inv = np.float32(np.float32(127) / amax)
            want = [np.round(np.float32(v * inv)) for v in group]  # numpy rounds half to even
            assert a[r, 32 * g:32 * g + 32].tolist() == want
            assert s[r, g].item() == np.float32(amax / np.float32(127))
            assert ms[r, g].item() == np.float32(np.float32(amax / np.float32(127)) * np.float32(sum(want)))


@pytest.mark.parametrize("shape", [(960, 576), (576, 1536)])
def test_the_result_is_the_int4_product_within_its_inputs_rounding(shape):
    """Against x @ W.T in float64 on the same int4 weights (what int4 computes, to rounding): each input moves by at
    most half its group's step (amax / 254), so the output moves by at most sum over groups of amax / 254 times
    the group's sum of |w|, plus bfloat16's rounding; and on these inputs it does move (w4a8 is not int4)."""
    linear, _, gen = make(*shape, seed=7)
    x = torch.randn(16, shape[1], generator=gen).bfloat16()
    w = linear.dequantized().double()
    exact = x.double() @ w.t()
    amax = x.double().view(16, -1, 32).abs().amax(-1)  # [rows, groups]
    wsum = w.abs().view(shape[0], -1, 32).sum(-1)  # [outputs, groups]
    bound = (amax / 254) @ wsum.t() * 1.001 + exact.abs() * 2.0 ** -8 + 1e-6
    got = linear.matmul(x).double()
    assert ((got - exact).abs() <= bound).all()
    int4 = x.double() @ w.t()
    assert (got != int4.bfloat16().double()).any()


def test_w4a8_is_refused_where_it_cannot_run():
    """A clear error, naming what to use instead: on CUDA (our kernel is CPU only) and in float32 (like int4)."""
    with pytest.raises(ValueError, match="'int4'"):
        parse_quantization("w4a8", torch.bfloat16, torch.device("cuda"))
    with pytest.raises(ValueError, match="bfloat16"):
        parse_quantization("w4a8", torch.float32, torch.device("cpu"))
    assert parse_quantization("w4a8", torch.bfloat16, torch.device("cpu")) == "w4a8"

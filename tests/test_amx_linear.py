"""The AMX linear (common/native/linear.cpp): a row's bits never depend on the call's other rows, and the
result is the product torch computes in float32, within bfloat16 rounding. Runs where the CPU has AMX-BF16;
elsewhere the linears are oneDNN's and torch's (tests/test_invariance.py, tests/test_quant.py cover those)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from common import native
from common.invariant import Linear
from common.quant import Int8Linear

pytestmark = pytest.mark.skipif(not native.amx_linear_ready(),
                                reason="no AMX-BF16 on this CPU (or no compiler): torch's linears run instead")
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (100, 70), (16, 32), (33, 64)]


def build(kind: str, weight: torch.Tensor, plain: bool = False):
    return Linear(weight.bfloat16(), plain) if kind == "bfloat16" else Int8Linear(weight, plain=plain)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 300), pick=st.integers(0, 299), shape=st.sampled_from(SHAPES),
       kind=st.sampled_from(["bfloat16", "int8"]), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1e-2, 1.0, 30.0]))
def test_row_has_the_same_bits_in_a_call_of_any_size(rows, pick, shape, kind, seed, scale):
    """Calls of more than 32 rows take several passes and a tail tile; none of it may change a row."""
    if kind != "bfloat16" and (shape[1] % 32 or shape[0] % 16):
        return  # the quantized linears take whole groups of 32 inputs and 16 outputs (tests/test_quant.py)
    gen = torch.Generator().manual_seed(seed)
    out_features, in_features = shape
    linear = build(kind, torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5)
    assert "AMX" in linear.backend
    x = (torch.randn(rows, in_features, generator=gen) * scale).bfloat16()
    i = pick % rows
    batched = linear.matmul(x)
    assert batched.shape == (rows, out_features)
    assert torch.equal(linear.matmul(x[i:i + 1])[0], batched[i])
    eye = torch.eye(in_features).bfloat16()
    weight = linear.dequantized() if kind != "bfloat16" else linear.matmul(eye).t().float()
    torch.testing.assert_close(batched.float(), x.float() @ weight.t(), rtol=1.6e-2, atol=1e-2 * scale)


def test_int8_holds_torchs_weights_and_matches_its_kernel_within_rounding():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3072, 576, generator=gen) * 0.05
    ours, torchs = build("int8", w), build("int8", w, plain=True)
    assert "AMX" in ours.backend and "torch" in torchs.backend
    assert torch.equal(ours.dequantized(), torchs.dequantized())  # the same weights, in another layout
    ids = torch.tensor([0, 15, 16, 3071, 17])
    assert torch.equal(ours.rows(ids), torchs.qweight[ids])  # the embedding lookup reads the packed copy
    x = torch.randn(40, 576, generator=gen).bfloat16()
    torch.testing.assert_close(ours.matmul(x).float(), torchs.matmul(x).float(), rtol=1.6e-2, atol=1e-3)


def test_every_int8_value_widens_exactly():
    """The kernel widens sign-and-magnitude bytes through two 128-entry tables: each of -127..127 must come
    back as itself (scale 1: every row's largest magnitude is 127), in every position of the packed order."""
    values = torch.arange(-127, 128).float()
    w = torch.stack([torch.cat([values.roll(i), torch.zeros(1)]) for i in range(16)])  # [16, 256]
    linear = build("int8", w)
    assert torch.equal(linear.scales.float(), torch.ones(16))
    assert torch.equal(linear.matmul(torch.eye(256).bfloat16()).t().float(), w)
    assert torch.equal(linear.rows(torch.arange(16)).float(), w)


def test_plain_math_keeps_torchs_own_linears():
    w = torch.randn(64, 64)
    assert Linear(w.bfloat16(), plain=True).backend == "oneDNN prepacked"
    assert Int8Linear(w, plain=True).backend == "torch Int8 kernel"


def test_bad_shapes_fail_clearly():
    linear = Linear(torch.randn(48, 64).bfloat16())
    with pytest.raises(RuntimeError, match="does not fit"):
        native.kernels(native.LINEAR_SOURCE).linear(torch.randn(2, 128).bfloat16(), linear.amx, None, 48)
    with pytest.raises(RuntimeError, match="bfloat16"):
        native.kernels(native.LINEAR_SOURCE).linear(torch.randn(2, 64), linear.amx, None, 48)
    with pytest.raises(RuntimeError, match="-127..127"):  # -128 has no sign-and-magnitude byte
        native.kernels(native.LINEAR_SOURCE).pack(torch.full((16, 32), -128, dtype=torch.int8))

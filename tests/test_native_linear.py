"""Our linears (numerics/native/linear.cpp: AMX, and linear_avx512.h's two kernels where there is no AMX): a row's
bits never depend on the call's other rows, and the result is the product torch computes in float32, within
bfloat16 rounding. Each test runs on every kernel this CPU has (the AVX-512 ones on AMX machines too, through
STEPWISE_LINEAR); where it has none, torch's linears run (tests/test_invariance.py and tests/test_quant.py cover
those)."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from common.numerics import native
from common.numerics.invariant import Linear
from common.numerics.int8 import Int8Linear

AVX512 = native.load(native.LINEAR_SOURCE) and native.kernels(native.LINEAR_SOURCE).avx512_ready()
KERNELS = [name for name, available in (("AMX", native.amx_linear_ready()), ("AVX-512 BF16", AVX512),
                                        ("AVX-512 FMA", AVX512)) if available]
pytestmark = pytest.mark.skipif(not KERNELS, reason="neither AMX-BF16 nor AVX-512 BF16 on this CPU (or no compiler)")
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (100, 70), (16, 32), (33, 64), (80, 64)]


@pytest.fixture(params=KERNELS or ["none"])
def kernel(request, monkeypatch):
    if request.param != "AMX":
        monkeypatch.setenv("STEPWISE_LINEAR", native.LINEAR_KERNELS[request.param])
    assert native.linear_kernel() == request.param
    return request.param


def build(kind: str, weight: torch.Tensor, plain: bool = False):
    return Linear(weight.bfloat16(), plain) if kind == "bfloat16" else Int8Linear(weight, plain=plain)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 300), pick=st.integers(0, 299), shape=st.sampled_from(SHAPES),
       kind=st.sampled_from(["bfloat16", "int8"]), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1e-2, 1.0, 30.0]))
def test_row_has_the_same_bits_in_a_call_of_any_size(kernel, rows, pick, shape, kind, seed, scale):
    """Calls of many rows take several passes and tails (of rows, of output blocks); none of it may change a row."""
    if kind != "bfloat16" and (shape[1] % 32 or shape[0] % 16):
        return  # the quantized linears take whole groups of 32 inputs and 16 outputs (tests/test_quant.py)
    gen = torch.Generator().manual_seed(seed)
    out_features, in_features = shape
    linear = build(kind, torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5)
    assert linear.backend.startswith(kernel)
    x = (torch.randn(rows, in_features, generator=gen) * scale).bfloat16()
    i = pick % rows
    batched = linear.matmul(x)
    assert batched.shape == (rows, out_features)
    assert torch.equal(linear.matmul(x[i:i + 1])[0], batched[i])
    eye = torch.eye(in_features).bfloat16()
    weight = linear.dequantized() if kind != "bfloat16" else linear.matmul(eye).t().float()
    torch.testing.assert_close(batched.float(), x.float() @ weight.t(), rtol=1.6e-2, atol=1e-2 * scale)


def test_int8_holds_torchs_weights_and_matches_its_kernel_within_rounding(kernel):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3072, 576, generator=gen) * 0.05
    ours, torchs = build("int8", w), build("int8", w, plain=True)
    assert ours.backend.startswith(kernel) and "torch" in torchs.backend
    assert torch.equal(ours.dequantized(), torchs.dequantized())  # the same weights, in another layout
    ids = torch.tensor([0, 15, 16, 3071, 17])
    assert torch.equal(ours.rows(ids), torchs.qweight[ids])  # the embedding lookup reads the packed copy
    x = torch.randn(40, 576, generator=gen).bfloat16()
    torch.testing.assert_close(ours.matmul(x).float(), torchs.matmul(x).float(), rtol=1.6e-2, atol=1e-3)


def test_every_int8_value_widens_exactly(kernel):
    """The kernel widens sign-and-magnitude bytes through two 128-entry tables: each of -127..127 must come
    back as itself (scale 1: every row's largest magnitude is 127), in every position of the packed order."""
    values = torch.arange(-127, 128).float()
    w = torch.stack([torch.cat([values.roll(i), torch.zeros(1)]) for i in range(16)])  # [16, 256]
    linear = build("int8", w)
    assert torch.equal(linear.scales.float(), torch.ones(16))
    assert torch.equal(linear.matmul(torch.eye(256).bfloat16()).t().float(), w)
    assert torch.equal(linear.rows(torch.arange(16)).float(), w)


@pytest.mark.parametrize("out_features", [16, 32, 48, 64])  # one block, and groups of 2, (3: none), and 4
def test_the_embedding_lookup_reads_the_rows_of_every_layout(kernel, out_features):
    """``int8_rows`` reads rows in place from the packed copy, whatever the layout (interleaved by 1, 2 or 4): int8,
    and dequantized to bfloat16, against torch's plain int8 weights and the same formula in tensor ops."""
    w = torch.randn(out_features, 96, generator=torch.Generator().manual_seed(out_features))
    ours, torchs = build("int8", w), build("int8", w, plain=True)
    assert ours.interleave == native.block_interleave(native.LINEAR_KERNELS[kernel], out_features)
    ids = torch.tensor([out_features - 1, 0, 17 % out_features, 5, 5])
    assert torch.equal(ours.rows(ids), torchs.qweight[ids])
    expected = (torchs.qweight[ids].float() * torchs.scales[ids].float()[:, None]).bfloat16()
    assert torch.equal(ours.rows(ids, dequantize=True), expected)
    assert torch.equal(torchs.rows(ids, dequantize=True), expected)
    with pytest.raises(RuntimeError, match="row id out of range"):
        ours.rows(torch.tensor([out_features + 16]))


def test_plain_math_keeps_torchs_own_linears():
    w = torch.randn(64, 64)
    assert Linear(w.bfloat16(), plain=True).backend == "oneDNN prepacked"
    assert Int8Linear(w, plain=True).backend == "torch Int8 kernel"


def test_bad_shapes_fail_clearly(kernel):
    linear = Linear(torch.randn(48, 64).bfloat16())
    kernels, name = native.kernels(native.LINEAR_SOURCE), native.LINEAR_KERNELS[kernel]
    with pytest.raises(RuntimeError, match="does not fit"):
        kernels.linear(torch.randn(2, 128).bfloat16(), linear.ours, None, 48, name)
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernels.linear(torch.randn(2, 64), linear.ours, None, 48, name)
    with pytest.raises(RuntimeError, match="kernel must be amx, fma or dot"):
        kernels.linear(torch.randn(2, 64).bfloat16(), linear.ours, None, 48, "fast")
    with pytest.raises(RuntimeError, match="-127..127"):  # -128 has no sign-and-magnitude byte
        kernels.pack(torch.full((16, 32), -128, dtype=torch.int8))
    if kernel == "AVX-512 FMA":
        records = torch.zeros(3, 2, 320, dtype=torch.uint8)
        with pytest.raises(RuntimeError, match="int4 runs on the amx and dot kernels only"):
            kernels.linear(torch.randn(2, 64).bfloat16(), records, None, 48, name)


def test_the_kernel_follows_from_the_cpu_and_a_bad_choice_is_named(monkeypatch):
    monkeypatch.delenv("STEPWISE_LINEAR", raising=False)
    first = native.linear_kernel()
    assert first == native.linear_kernel() and first in (None, *native.LINEAR_KERNELS)
    monkeypatch.setenv("STEPWISE_LINEAR", "fastest")
    with pytest.raises(ValueError, match="STEPWISE_LINEAR='fastest': use auto, dot, fma or torch"):
        native.linear_kernel()


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
@pytest.mark.parametrize("out_features", [64, 96, 48])  # 4, 6 and 3 blocks of 16: grouped by 4, by 2, not at all
def test_interleaved_blocks_give_the_bits_of_blocks_in_order(kernel, kind, out_features):
    """For the AVX-512 kernels `pack` interleaves the lines of groups of blocks (numerics.native.block_interleave): the
    layout moves bytes, never a result. And the kernel must be told the layout: read as the other, it gives others."""
    if kernel == "AMX":
        pytest.skip("AMX's tiles read blocks in order only")
    kernels, name = native.kernels(native.LINEAR_SOURCE), native.LINEAR_KERNELS[kernel]
    gen = torch.Generator().manual_seed(5)
    if kind == "int8":
        weight = torch.randint(-127, 128, (out_features, 96), dtype=torch.int8, generator=gen)
        scales = torch.rand(out_features, generator=gen)
    else:
        weight, scales = (torch.randn(out_features, 96, generator=gen) * 96 ** -0.5).bfloat16(), None
    x = torch.randn(7, 96, generator=gen).bfloat16()
    group = native.block_interleave(name, out_features)
    assert group == {64: 4, 96: 2, 48: 1}[out_features]
    in_order = kernels.pack(weight, 1)
    expected = kernels.linear(x, in_order, scales, out_features, name, 1)
    for interleave in (2, 4):
        if out_features // 16 % interleave:
            with pytest.raises(RuntimeError, match="interleave"):
                kernels.pack(weight, interleave)
            continue
        packed = kernels.pack(weight, interleave)
        assert packed.shape == in_order.shape and not torch.equal(packed, in_order)
        for rows in (1, 2, 7):
            result = kernels.linear(x[:rows], packed, scales, out_features, name, interleave)
            assert torch.equal(result, expected[:rows])
        assert not torch.equal(kernels.linear(x, packed, scales, out_features, name, 1), expected)


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (100, 70), (80, 64)])
def test_a_rows_order_of_sums_shows_and_never_depends_on_the_call(kernel, kind, shape):
    """float32 sums rounded to bfloat16 hide most changes of order (a one-ulp difference in float32 rarely moves
    the bfloat16 result), so the random rows of the test above could miss a kernel that sums some rows in another
    order. Here each row adds +B w and later -B w (B = 2^20): every product in between is added to a partial sum
    of about B |w|, whose rounding (about 2^-8 of the result) depends on what was added before it, so a change in
    the order of any of those additions shows in the bfloat16 result."""
    if kind != "bfloat16" and (shape[1] % 32 or shape[0] % 16):
        return
    out_features, in_features = shape
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5
    first, last = 1, in_features - 2
    w[:, last] = w[:, first]
    linear = build(kind, w)
    x = torch.randn(40, in_features, generator=gen)
    x[:, first], x[:, last] = 2.0 ** 20, -2.0 ** 20
    x = x.bfloat16()
    alone = torch.cat([linear.matmul(x[i:i + 1]) for i in range(40)])
    for rows in (2, 3, 5, 6, 7, 13, 40):
        assert torch.equal(linear.matmul(x[:rows]), alone[:rows]), rows
    # and the test can fail: the same products summed in another order (the inputs between the two large ones
    # reversed, in x and in the weight alike) give other bits
    order = torch.cat([torch.arange(first + 1), torch.arange(first + 1, last).flip(0), torch.arange(last, in_features)])
    assert not torch.equal(build(kind, w[:, order]).matmul(x[:, order]), alone)

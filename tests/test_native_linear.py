"""Our linears (numerics/native/linear.cpp: AMX, linear_avx512.h's two kernels where there is no AMX, and the portable
kernel of linear_portable.h on any CPU): a row's bits never depend on the call's other rows, and the result is the
product torch computes in float32, within bfloat16 rounding. Each test runs on every kernel this CPU has (the
AVX-512 ones on AMX machines too, and the portable one everywhere, through STEPWISE_LINEAR). The portable kernel's
bits are also checked against its definition written in tensor ops (common/numerics/linear_reference.py), and on a
CPU with AVX-512 against the AVX-512 kernels it reproduces. Where linear.cpp does not build, torch's linears run
(tests/test_invariance.py and tests/test_quant.py cover those)."""
import ctypes
import ctypes.util

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from common.numerics import linear_reference as reference, native
from common.numerics.invariant import Linear, uses_packed_bf16
from common.numerics.int4 import Int4Linear, q4_1_groups, q4_1_quantize
from common.numerics.int8 import Int8Linear
from workloads import examples

BUILT = native.load(native.LINEAR_SOURCE)
AVX512 = BUILT and native.kernels(native.LINEAR_SOURCE).avx512_ready()
PORTABLE = f"portable {native.kernels(native.LINEAR_SOURCE).portable_isa()}" if BUILT else None
KERNELS = [name for name, available in (("AMX", native.amx_linear_ready()), ("AVX-512 BF16", AVX512),
                                        ("AVX-512 FMA", AVX512), (PORTABLE, BUILT)) if available]
pytestmark = pytest.mark.skipif(not KERNELS, reason="linear.cpp did not build here (no compiler?)")
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (100, 70), (16, 32), (33, 64), (80, 64)]


def use(monkeypatch, name: str) -> str:
    """Makes ``name`` the kernel our linears take (STEPWISE_LINEAR), checked."""
    if name != "AMX":
        monkeypatch.setenv("STEPWISE_LINEAR", native.LINEAR_KERNELS[name])
    assert native.linear_kernel() == name
    return name


@pytest.fixture(params=KERNELS or ["none"])
def kernel(request, monkeypatch):
    return use(monkeypatch, request.param)


@pytest.fixture
def portable(monkeypatch):
    if not BUILT:
        pytest.skip("linear.cpp did not build here")
    return use(monkeypatch, PORTABLE)


def build(kind: str, weight: torch.Tensor, plain: bool = False):
    if kind in ("bfloat16", "float32"):
        return Linear(weight.to(getattr(torch, kind)), plain)
    if kind == "int4":
        return Int4Linear.from_q4_1(q4_1_quantize(weight), plain=plain)
    return Int8Linear(weight, plain=plain)


def kinds(kernel: str) -> list[str]:
    """The weights a kernel takes in these tests: the portable one float32 and int4 too (tests/test_quant.py runs
    int4 on the others)."""
    return ["bfloat16", "int8"] + (["float32", "int4"] if native.is_portable(kernel) else [])


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 300), pick=st.integers(0, 299), shape=st.sampled_from(SHAPES), kind=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-2, 1.0, 30.0]))
def test_row_has_the_same_bits_in_a_call_of_any_size(kernel, rows, pick, shape, kind, seed, scale):
    """Calls of many rows take several passes and tails (of rows, of output blocks); none of it may change a row."""
    kind = kinds(kernel)[kind % len(kinds(kernel))]
    if kind not in ("bfloat16", "float32") and (shape[1] % 32 or shape[0] % 16):
        return  # the quantized linears take whole groups of 32 inputs and 16 outputs (tests/test_quant.py)
    gen = torch.Generator().manual_seed(seed)
    out_features, in_features = shape
    linear = build(kind, torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5)
    assert linear.backend.startswith(kernel)
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    x = (torch.randn(rows, in_features, generator=gen) * scale).to(dtype)
    i = pick % rows
    batched = linear.matmul(x)
    assert batched.shape == (rows, out_features) and batched.dtype == dtype
    assert torch.equal(linear.matmul(x[i:i + 1])[0], batched[i])
    eye = torch.eye(in_features, dtype=dtype)
    weight = linear.dequantized() if kind in ("int8", "int4") else linear.matmul(eye).t().float()
    torch.testing.assert_close(batched.float(), x.float() @ weight.t(), rtol=1.6e-2, atol=1e-2 * scale)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), shape=st.sampled_from(SHAPES), kind=st.sampled_from(["bfloat16", "float32", "int8",
                                                                                       "int4"]),
       seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([2.0 ** -120, 1e-2, 1.0, 30.0]), data=st.data())
def test_portable_kernel_gives_the_bits_of_its_definition(portable, rows, shape, kind, seed, scale, data):
    """Every bit of a call of 1..40 rows against the chains linear_portable.h defines, computed in tensor ops from the
    unpacked weights (common/numerics/linear_reference.py), on some outputs (a ragged last block among them); tiny
    inputs (2^-120) make subnormal sums, which round to signed zeros. Order-revealing rows (+B w, later -B w) make
    any other order of the sums show."""
    out_features, in_features = shape
    if kind in ("int8", "int4") and (in_features % 32 or out_features % 16):
        return
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    x = torch.randn(rows, in_features, generator=gen) * scale
    first, last = 1, (30 if kind == "int4" else in_features - 2)
    x[::3, first], x[::3, last] = 2.0 ** 20 * scale, -2.0 ** 20 * scale
    w[:, last] = w[:, first]
    x = x.to(dtype)
    linear = build(kind, w)
    assert linear.backend.startswith(portable)
    got = linear.matmul(x)
    outputs = sorted({out_features - 1, *data.draw(st.lists(st.integers(0, out_features - 1), max_size=12))})
    if kind in ("bfloat16", "float32"):
        expected = reference.dense(x.float(), w.to(dtype).float()[outputs], dtype)
    elif kind == "int8":
        expected = reference.int8(x.float(), linear.qweight[outputs].float(), linear.scales[outputs])
    else:
        codes, d, m = (torch.from_numpy(t.astype(np.float32)) for t in q4_1_groups(q4_1_quantize(w)))
        expected = reference.int4(x.float(), codes[outputs], d[outputs], m[outputs])
    assert torch.equal(got[:, outputs], expected.to(dtype))


def test_the_references_fma_is_libms():
    """linear_reference.fma32 (float64 arithmetic, corrected where rounding twice differs) against the C
    library's fmaf: on random triples, and on products that land a hair off a float32 midpoint, where a float64
    sum rounds onto the midpoint and then the wrong way."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fmaf.restype, libm.fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3
    gen = torch.Generator().manual_seed(0)
    n = 3000
    a = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-20, 20, (n,), generator=gen).float())
    b, c = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 2.0 ** 10
    powers = torch.exp2(torch.randint(-20, 20, (1000,), generator=gen).float())
    signs = torch.where(torch.rand(1000, generator=gen) < 0.5, 1.0, -1.0)
    a[:1000], b[:1000] = (1 + 2.0 ** -22) * 2.0 ** -17 * powers * signs, 1 - 2.0 ** -22
    c[:1000] = (2.0 ** 7 + 2.0 ** -16) * powers * signs  # a b + c: a midpoint minus 2^-61 of it
    want = torch.tensor([libm.fmaf(*t) for t in zip(a.tolist(), b.tolist(), c.tolist())])
    got = reference.fma32(a.double(), b.double(), c.double()).float()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert not torch.equal((a.double() * b.double() + c.double()).float(), want)  # the traps do trap


@pytest.mark.skipif(not AVX512, reason="the AVX-512 kernels need AVX-512 BF16 (this CPU has not)")
@pytest.mark.parametrize("kind", ["bfloat16", "int8", "int4"])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (100, 70), (48, 64)])
def test_portable_kernel_gives_the_avx512_kernels_bits(monkeypatch, kind, shape):
    """The portable kernel reproduces the AVX-512 FMA kernel (bfloat16, int8) bit for bit, and the int4 sums of the
    AVX-512 BF16 kernel (VDPBF16PS: each pair odd input first), on inputs far from subnormals (VDPBF16PS flushes
    those, the portable kernel's fused multiply-adds do not), order-revealing rows included."""
    out_features, in_features = shape
    if kind != "bfloat16" and (in_features % 32 or out_features % 16):
        return
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5
    x = torch.randn(40, in_features, generator=gen)
    last = 30 if kind == "int4" else in_features - 2
    x[::3, 1], x[::3, last], w[:, last] = 2.0 ** 20, -2.0 ** 20, w[:, 1]
    x = x.bfloat16()
    results = {}
    for name in ("AVX-512 BF16" if kind == "int4" else "AVX-512 FMA", PORTABLE):
        use(monkeypatch, name)
        linear = build(kind, w)
        assert linear.backend.startswith(name)
        results[name] = torch.cat([linear.matmul(x[:rows]) for rows in (1, 7, 40)])
    first, second = results.values()
    assert torch.equal(first, second)


def test_the_portable_kernel_runs_where_no_avx512_kernel_does(monkeypatch):
    """On a CPU without AMX and AVX-512 BF16 (AVX2, ARM) our linears are the portable kernel, not torch's: bfloat16
    is not widened to float32, and float32 takes it too."""
    monkeypatch.delenv("STEPWISE_LINEAR", raising=False)
    if not BUILT or AVX512 or native.amx_linear_ready():
        pytest.skip("this CPU runs another of our kernels" if BUILT else "linear.cpp did not build here")
    assert native.linear_kernel() == PORTABLE and native.int4_kernel() == PORTABLE
    for dtype in (torch.bfloat16, torch.float32):
        linear = Linear(torch.randn(48, 64).to(dtype))
        assert linear.backend == f"{PORTABLE} kernel (stepwise)" and not linear.widen and linear.weight_t is None


def test_float32_weights_take_the_portable_kernel_whichever_kernel_bfloat16_takes(monkeypatch):
    """AMX and the AVX-512 kernels read bfloat16 only; float32 weights run the portable kernel on every CPU where
    linear.cpp built (they fell to torch.mm, padded to a row tile, on AVX-512 machines), with the definition's
    bits (linear_reference.dense) alone and in a call of 40 rows."""
    monkeypatch.delenv("STEPWISE_LINEAR", raising=False)
    if not BUILT:
        pytest.skip("linear.cpp did not build here")
    assert native.float32_kernel() == PORTABLE
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(80, 64, generator=gen) / 8, torch.randn(40, 64, generator=gen)
    linear = Linear(w)
    assert linear.backend == f"{PORTABLE} kernel (stepwise)" and linear.weight_t is None
    expected = reference.dense(x, w, torch.float32)
    assert torch.equal(linear.matmul(x), expected)
    assert torch.equal(torch.cat([linear.matmul(x[r:r + 1]) for r in range(40)]), expected)
    bf16 = Linear(w.bfloat16())
    assert bf16.backend == f"{native.linear_kernel()} kernel (stepwise)"  # bfloat16 keeps this CPU's fastest
    monkeypatch.setenv("STEPWISE_LINEAR", "torch")
    assert native.float32_kernel() is None and "torch" in Linear(w).backend


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
    bf16 = "oneDNN prepacked" if uses_packed_bf16(torch.device("cpu"), torch.bfloat16) else "torch.mm in float32"
    assert Linear(w.bfloat16(), plain=True).backend.startswith(bf16)
    assert Linear(w, plain=True).backend == "torch.mm on cpu"
    assert Int8Linear(w, plain=True).backend == "torch Int8 kernel"


def test_bad_shapes_fail_clearly(kernel):
    linear = Linear(torch.randn(48, 64).bfloat16())
    kernels, name = native.kernels(native.LINEAR_SOURCE), native.LINEAR_KERNELS[kernel]
    with pytest.raises(RuntimeError, match="does not fit"):
        kernels.linear(torch.randn(2, 128).bfloat16(), linear.ours, None, 48, name)
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernels.linear(torch.randn(2, 64), linear.ours, None, 48, name)
    with pytest.raises(RuntimeError, match="kernel must be amx, fma, dot, portable or w4a8"):
        kernels.linear(torch.randn(2, 64).bfloat16(), linear.ours, None, 48, "fast")
    with pytest.raises(RuntimeError, match="w4a8 reads int4 records"):
        kernels.linear(torch.randn(2, 64).bfloat16(), linear.ours, None, 48, "w4a8")
    with pytest.raises(RuntimeError, match="-127..127"):  # -128 has no sign-and-magnitude byte
        kernels.pack(torch.full((16, 32), -128, dtype=torch.int8))
    if native.is_portable(kernel):
        avx512_int8 = kernels.pack(torch.ones(48, 64, dtype=torch.int8))  # sign and magnitude, [3, 32, 16, 2]
        with pytest.raises(RuntimeError, match="not pack_portable's"):
            kernels.linear(torch.randn(2, 64).bfloat16(), avx512_int8, torch.ones(48), 48, name)
        with pytest.raises(RuntimeError, match="float32 for float32 weights"):
            kernels.linear(torch.randn(2, 64).bfloat16(), kernels.pack_portable(torch.randn(48, 64)), None, 48, name)
        with pytest.raises(RuntimeError, match="interleaved"):
            kernels.linear(torch.randn(2, 64).bfloat16(), linear.ours, None, 48, name, 2)
        with pytest.raises(RuntimeError, match="groups of 32 inputs"):
            kernels.pack_int4_portable(torch.zeros(16, 48, dtype=torch.uint8), torch.zeros(16, 1).half(),
                                       torch.zeros(16, 1).half())
    if kernel == "AVX-512 FMA":
        records = torch.zeros(3, 2, 320, dtype=torch.uint8)
        with pytest.raises(RuntimeError, match="int4 runs on the amx and dot kernels only"):
            kernels.linear(torch.randn(2, 64).bfloat16(), records, None, 48, name)


def test_the_kernel_follows_from_the_cpu_and_a_bad_choice_is_named(monkeypatch):
    monkeypatch.delenv("STEPWISE_LINEAR", raising=False)
    first = native.linear_kernel()
    assert first == native.linear_kernel() and first in (None, *native.LINEAR_KERNELS)
    monkeypatch.setenv("STEPWISE_LINEAR", "fastest")
    with pytest.raises(ValueError, match="STEPWISE_LINEAR='fastest': use auto, dot, fma, portable or torch"):
        native.linear_kernel()


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
@pytest.mark.parametrize("out_features", [64, 96, 48])  # 4, 6 and 3 blocks of 16: grouped by 4, by 2, not at all
def test_interleaved_blocks_give_the_bits_of_blocks_in_order(kernel, kind, out_features):
    """For the AVX-512 kernels `pack` interleaves the lines of groups of blocks (numerics.native.block_interleave): the
    layout moves bytes, never a result. And the kernel must be told the layout: read as the other, it gives others."""
    if kernel == "AMX" or native.is_portable(kernel):
        pytest.skip(f"{kernel} reads blocks in order only")
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


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
@pytest.mark.parametrize("out_features", [128, 80])
def test_sixteen_rows_of_a_long_input_keep_every_rows_bits(kernel, kind, out_features):
    """A down projection of the 1B shapes (8,192 inputs) at 16 rows, the decode step of 16 requests: the AVX-512
    kernels take three passes over the rows (6, 6, 4) of weights that no longer fit L2 between them (64 outputs x
    8,192 inputs of bfloat16 is 1 MiB), and no pass, tail or layout (interleaved by 4, or block after block for 80
    outputs) may change a row: every row has the bits it has alone, order-revealing rows (+B w, later -B w) included,
    and where the kernel's sums are the fused multiply-add chains (the FMA and portable kernels), the definition's
    bits (linear_reference.dense) on some outputs, the ragged last block's among them."""
    in_features = 8192
    gen = torch.Generator().manual_seed(13)
    w = torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5
    first, last = 1, in_features - 2
    w[:, last] = w[:, first]
    linear = build(kind, w)
    x = torch.randn(16, in_features, generator=gen)
    x[:, first], x[:, last] = 2.0 ** 20, -2.0 ** 20
    x = x.bfloat16()
    alone = torch.cat([linear.matmul(x[i:i + 1]) for i in range(16)])
    for rows in (16, 13, 12, 7):
        assert torch.equal(linear.matmul(x[:rows]), alone[:rows]), rows
    if kind == "bfloat16" and kernel in ("AVX-512 FMA", PORTABLE):
        outputs = torch.tensor([0, 37, out_features - 1])
        expected = reference.dense(x.float(), w.bfloat16().float()[outputs], torch.bfloat16)
        assert torch.equal(alone[:, outputs], expected)

"""The portable linear's results written out from its definition (common/numerics/native/linear_portable.h and
linear_portable_w4a8.h), in
tensor ops on the unpacked weights: an oracle for its bits (tests/test_native_linear.py, stage 04's ``--kernels``
table), independent of its packing, blocking and threads. Slow (a Python loop over the inputs): for checks only.

Each output is a chain of float32 fused multiply-adds in input order, ``acc = fma(x_i, w_i, acc)`` from +0 (inputs
zero padded to a multiple of 32); int8 scales the sum once; int4 sums each group of 32 inputs in a chain of its own,
each input pair odd input first, then adds ``d * part`` and ``m * (the group's sum of x)``. bfloat16 results round
like VCVTNEPS2BF16 (to nearest even, a subnormal to a signed zero). torch has no fused multiply-add, so ``fma32``
computes one in float64 and corrects the one case where rounding twice (to float64, then to float32) differs
from rounding once."""
import torch


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma(a, b, c) = a * b + c rounded once, for float64 tensors holding float32 values (no overflow)."""
    p = a * b  # exact: 24 + 24 significant bits fit float64's 53
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # s + err is p + c exactly (TwoSum)
    r = s.float()
    d = s - r.double()
    toward = torch.where(d > 0, torch.inf, -torch.inf).float()
    beyond = torch.nextafter(r, toward).double()
    # s rounded to float32 is right unless s is a float32 midpoint that is not the exact sum: then the exact sum
    # lies past the midpoint (away from r) when err points the way d does
    midpoint = (d != 0) & (d.abs() * 2 == (beyond - r.double()).abs())
    return torch.where(midpoint & (err != 0) & ((err > 0) == (d > 0)), beyond, r.double())


def round_bf16(v: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 as VCVTNEPS2BF16 rounds: nearest even, subnormals to signed zero."""
    v = v.float()
    return torch.where(v.abs() < torch.finfo(torch.float32).tiny, v * 0, v).bfloat16()


def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [rows, k], w [outputs, k] (float32 values) -> the float32 chains [rows, outputs], as float64."""
    x, w = x.double(), w.double()
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float64)
    for i in range(x.shape[1]):
        acc = fma32(x[:, i:i + 1], w[None, :, i], acc)
    return acc + 0.0 if x.shape[1] % 32 else acc  # the zero padding's fma(0, 0, acc): -0 becomes +0


def dense(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Weights of ``dtype``, bfloat16 (bfloat16 out) or float32 (float32 out), their values in ``w``."""
    acc = chain(x, w)
    return acc.float() if dtype == torch.float32 else round_bf16(acc)


def int8(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return round_bf16(chain(x, q).float() * scales.float())


def group_sums(x: torch.Tensor) -> torch.Tensor:
    """[rows, k] -> [rows, k / 32]: x[i] + x[i + 16], then halves (8 + 8, 4 + 4, j and j + 2, 0 and 1), float32."""
    g = x.float().view(x.shape[0], -1, 32)
    v = g[..., :16] + g[..., 16:]
    t = v[..., :8] + v[..., 8:]
    u = t[..., :4] + t[..., 4:]
    return (u[..., 0] + u[..., 2]) + (u[..., 1] + u[..., 3])


def int4(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """codes [outputs, k] (0..15), d and m [outputs, k / 32] (float16 values)."""
    xd, q = x.double(), codes.double()
    sums = group_sums(x).double()
    acc = torch.zeros(x.shape[0], codes.shape[0], dtype=torch.float64)
    for g in range(codes.shape[1] // 32):
        part = torch.zeros_like(acc)
        for pair in range(16):
            for i in (32 * g + 2 * pair + 1, 32 * g + 2 * pair):  # odd input first
                part = fma32(xd[:, i:i + 1], q[None, :, i], part)
        acc = fma32(d[None, :, g].double(), part, acc)
        acc = fma32(m[None, :, g].double(), sums[:, g:g + 1], acc)
    return round_bf16(acc)


W4A8_MIN = 2.0 ** -100  # a group's largest |x| below this quantizes to zeros


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[rows, k] -> w4a8's int8 inputs a [rows, k] (as float32), s and ms [rows, k / 32], each float32 operation as
    ``quantize_rows`` in linear_portable_w4a8.h does it (torch.round: to nearest even, like nearbyint)."""
    g = x.float().view(x.shape[0], -1, 32)
    amax = g.abs().amax(-1)
    ok = amax >= W4A8_MIN
    c = torch.full_like(amax, 127.0)  # tensor by tensor: torch divides a scalar by a tensor as a reciprocal times it
    inv = torch.where(ok, c / torch.where(ok, amax, c), 0.0)
    a = torch.round(g * inv[..., None])
    s = torch.where(ok, amax / c, 0.0)
    return a.view(x.shape), s, s * a.sum(-1)  # a's sum: integers below 2^24, exact in float32


def w4a8(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """codes [outputs, k] (0..15), d and m [outputs, k / 32] (float16 values): int4's weights times the rows rounded
    to int8. Each group's sum of q a is an integer (at most 32 * 15 * 127 in size), so a float64 matmul finds it
    exactly; then group after group acc = fma(m, ms, fma(d * s, sum, acc))."""
    a, s, ms = quantize_rows(x)
    rows, groups = x.shape[0], codes.shape[1] // 32
    dots = torch.einsum("rgi,ogi->rog", a.double().view(rows, groups, 32), codes.double().view(-1, groups, 32))
    acc = torch.zeros(rows, codes.shape[0], dtype=torch.float64)
    for g in range(groups):
        ds = (d[None, :, g].float() * s[:, g:g + 1]).double()  # rounded to float32, as the kernel's multiply
        acc = fma32(ds, dots[..., g], acc)
        acc = fma32(m[None, :, g].double(), ms[:, g:g + 1].double(), acc)
    return round_bf16(acc)

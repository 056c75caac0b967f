"""The quantized linears on CUDA: Triton kernels that read int8 or int4 weights and widen them in registers.

On CPU ``common.numerics.quant`` runs our AMX kernel (int8) and torch's packed kernel (int4). Neither
exists on a GPU, so here each program of a Triton kernel multiplies BLOCK_M rows of
activations by BLOCK_N outputs' weights, loading the weights at 8 or 4 bits and widening
them to bfloat16 next to the tensor cores: the bytes a decode step reads shrink by 2x or 4x,
which is the whole point on a bandwidth-bound step.

Batch invariance by construction: the tile sizes are constants, never chosen from the number
of rows, so a row is always multiplied in the same tiles, over the input features in the
same order (BLOCK_K or one group at a time, in order); rows past the end are masked to zero
and touch no other row's sums. More rows only launch more programs.

* int8 (``w = q * s`` per output): the sums run over the exact integers q (|q| <= 127 is
  exact in bfloat16) and are scaled once at the end, as on CPU.
* int4 keeps the GGUF's Q4_1 bytes as they are (a group of 32 weights in 16 bytes: byte j
  holds weight j in its low nibble and weight j + 16 in its high one) and the group's fp16
  ``d`` and ``m``: ``w = d * q + m``. Each group's sum is
  ``d * (x . q) + m * sum(x)``, the integers q again exact in bfloat16: the GGUF's own weights,
  without the CPU path's rounding of ``d`` and ``m`` to bfloat16.

Set ``TRITON_INTERPRET=1`` before importing this module to run the kernels on CPU (the tests).
The interpreter multiplies bfloat16 dot operands as their raw 16-bit patterns (Triton 3.9), so
there the dots take float32 operands instead: the products are exact either way (8 by at most
8 significant bits), only the order of the additions inside a dot differs.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


# Constants: a row's sums never depend on how many rows a call holds. The input features K are a compile-time
# constant too (a binary per linear shape): triton 3.6's interpreter takes no loop bound from a runtime argument.
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32
GROUP_SIZE = 32  # weights per d and m: GGUF Q4_1's block, fixed by the format (quant.GROUP_SIZE)
DOT_IN_FP32 = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _dot(a, b, acc, FP32: tl.constexpr):
    """acc + a @ b, a and b holding bfloat16 values (b's integers exact)."""
    if FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)


@triton.jit(do_not_specialize=["M"])  # one binary for every row count
def _int8_linear_kernel(x_ptr, q_ptr, scale_ptr, out_ptr, M, N, K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        DOT_IN_FP32: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    x_ptrs = x_ptr + rows[:, None] * K + ks[None, :]
    q_ptrs = q_ptr + cols[None, :] * K + ks[:, None]  # [BLOCK_K, BLOCK_N]: the weights transposed by the load
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # in order: the one summation order of every row
        x = tl.load(x_ptrs + k0, mask=row_ok[:, None], other=0.0)
        q = tl.load(q_ptrs + k0, mask=col_ok[None, :], other=0)
        acc = _dot(x, q.to(tl.float32), acc, DOT_IN_FP32)
    scale = tl.load(scale_ptr + cols, mask=col_ok, other=0.0)
    out = (acc * scale[None, :]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["M"])
def _int4_linear_kernel(x_ptr, nibbles_ptr, d_ptr, m_ptr, out_ptr, M, N, K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 16)
    row_ok, col_ok = rows < M, cols < N
    x_ptrs = x_ptr + rows[:, None] * K + j[None, :]  # the first half of group 0
    b_ptrs = nibbles_ptr + cols[None, :] * (K // 2) + j[:, None]  # [16, BLOCK_N]: group 0's bytes, transposed
    dm_offsets = cols * (K // 32)  # each output's first (d, m)
    zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = zero
    for k0 in range(0, K, 32):  # group after group, in order
        x_low = tl.load(x_ptrs + k0, mask=row_ok[:, None], other=0.0)  # inputs j of the group
        x_high = tl.load(x_ptrs + (k0 + 16), mask=row_ok[:, None], other=0.0)  # inputs j + 16
        b = tl.load(b_ptrs + k0 // 2, mask=col_ok[None, :], other=0)
        xq = _dot(x_high, (b >> 4).to(tl.float32), _dot(x_low, (b & 0xF).to(tl.float32), zero, DOT_IN_FP32),
                  DOT_IN_FP32)  # x . q over the group, the integers q exact
        x_sum = tl.sum(x_low.to(tl.float32) + x_high.to(tl.float32), axis=1)
        d = tl.load(d_ptr + dm_offsets + k0 // 32, mask=col_ok, other=0.0).to(tl.float32)
        m = tl.load(m_ptr + dm_offsets + k0 // 32, mask=col_ok, other=0.0).to(tl.float32)
        acc += xq * d[None, :] + x_sum[:, None] * m[None, :]
    out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


def _grid(m: int, n: int) -> tuple[int, int]:
    return triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N)


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [m, k] bfloat16 times int8 weights q [n, k] with float32 scales [n]: (x . q) * scale, in bfloat16."""
    (m, k), n = x.shape, q.shape[0]
    assert k % BLOCK_K == 0 and q.shape[1] == k, (x.shape, q.shape)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _int8_linear_kernel[_grid(m, n)](x.contiguous(), q, scale, out, m, n, k,
                                     BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT_IN_FP32=DOT_IN_FP32)
    return out


def int4_linear(x: torch.Tensor, nibbles: torch.Tensor, d: torch.Tensor, m_: torch.Tensor) -> torch.Tensor:
    """x [m, k] bfloat16 times Q4_1 weights: nibbles [n, k / 2] uint8 in the GGUF's order, d and m [n, k / 32]
    fp16; each weight is d * q + m."""
    (m, k), n = x.shape, nibbles.shape[0]
    assert k % GROUP_SIZE == 0 and nibbles.shape[1] * 2 == k and d.shape == (n, k // GROUP_SIZE), \
        (x.shape, nibbles.shape)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _int4_linear_kernel[_grid(m, n)](x.contiguous(), nibbles, d, m_, out, m, n, k, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                     DOT_IN_FP32=DOT_IN_FP32)
    return out


def q4_1_nibbles(codes) -> torch.Tensor:
    """codes [n, k] in 0..15 -> [n, k / 2] uint8 in Q4_1's order (byte j of a group: weights j and j + 16)."""
    c = torch.as_tensor(codes).to(torch.uint8).view(codes.shape[0], -1, 2, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(codes.shape[0], -1).contiguous()

"""Fused element-wise kernels: each reads its inputs once and writes its outputs once.

Unfused, ``residual + x`` then RMSNorm reads and writes the hidden state several times
(add, square, sum, scale, multiply); RoPE builds swapped-half copies; SwiGLU writes
``silu(gate)`` before multiplying by ``up``. Decoding is bound by memory traffic, so one
pass per operation is the saving.

Each kernel reproduces ``common.numerics.ops`` bit for bit, so stage 04 keeps the reference's
tokens: the same rounding points (to the model dtype where torch rounds), RMSNorm's sum of
squares lane by lane in float64 and its root in float64, IEEE division (``div_rn``; Triton's
``/`` is approximate on CUDA), libdevice's ``exp`` (the one CUDA's eager ``silu`` uses), and
no multiply-add contracted into one rounding (launched with ``enable_fp_fusion=False``).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from common.numerics.ops import LANES

EXACT = {"enable_fp_fusion": False}  # launch option: a * b + c stays two roundings
# libdevice's exp is what CUDA's eager silu calls; the CPU interpreter has no libdevice (it uses numpy's exp).
LIBDEVICE_EXP = os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, HAS_RESIDUAL: tl.constexpr,
                         BLOCK: tl.constexpr, LANES: tl.constexpr):
    # lab 04.1 begin: the fused add_rms_norm kernel
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    x = x.to(res_ptr.dtype.element_ty)  # the residual stream keeps the model's dtype
    tl.store(res_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    # The sum of squares in common.numerics.ops' order: each lane adds its chunk's square in float64, chunk after chunk,
    # then the lanes are added in order.
    lanes = tl.arange(0, LANES)
    per_lane = tl.zeros([LANES], tl.float64)
    for chunk in range(0, n_cols // LANES):
        v = tl.load(res_ptr + row * n_cols + chunk * LANES + lanes).to(tl.float32)
        per_lane += (v * v).to(tl.float64)
    total = tl.zeros([1], tl.float64)
    for lane in tl.static_range(LANES):
        total += tl.sum(tl.where(lanes == lane, per_lane, 0.0), axis=0)  # one nonzero term: exact
    mean_sq = tl.div_rn(tl.sum(total, axis=0).to(tl.float32), n_cols.to(tl.float32)) + eps
    root = tl.sqrt(mean_sq.to(tl.float64)).to(tl.float32)  # a float64 root is correctly rounded on CUDA too
    normed = tl.div_rn(xf, root).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)
    # lab 04.1 end


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(RMSNorm(x + residual) * weight, x + residual), the sum written into ``residual`` in place
    (vLLM's fused_add_rms_norm); with no residual, x itself is the residual stream."""
    rows, n = x.shape
    assert x.is_contiguous() and (residual is None or residual.is_contiguous()) and n % LANES == 0
    if residual is None:
        residual = x
    out = torch.empty_like(x)
    _add_rms_norm_kernel[(rows,)](x, residual, weight, out, n, eps, HAS_RESIDUAL=residual is not x,
                                  BLOCK=triton.next_power_of_2(n), LANES=LANES, **EXACT)
    return out, residual


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, n_heads, stride_tok, stride_head, HALF: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < n_heads) & (dims < HALF)
    # The tables are (cos, cos) and (-sin, sin) per token (common.numerics.ops.rope_tables): x * cos + roll(x) * sin.
    row = tok * 2 * HALF
    cos1 = tl.load(cos_ptr + row + dims, mask=dims < HALF, other=0.0)
    cos2 = tl.load(cos_ptr + row + HALF + dims, mask=dims < HALF, other=0.0)
    sin1 = tl.load(sin_ptr + row + dims, mask=dims < HALF, other=0.0)
    sin2 = tl.load(sin_ptr + row + HALF + dims, mask=dims < HALF, other=0.0)
    base = x_ptr + tok * stride_tok + heads * stride_head + dims
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(base, (x1 * cos1 + x2 * sin1).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + HALF, (x2 * cos2 + x1 * sin2).to(x_ptr.dtype.element_ty), mask=mask)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [tokens, heads, head_dim] in place (the rotate-half layout); cos, sin: [tokens, 1, head_dim] fp32,
    the per-token tables of ``common.numerics.ops.rope_tables``."""
    tokens, heads, d = x.shape
    assert x.stride(2) == 1 and d % 2 == 0
    cos, sin = cos.reshape(tokens, d).contiguous(), sin.reshape(tokens, d).contiguous()
    _rope_kernel[(tokens,)](x, cos, sin, heads, x.stride(0), x.stride(1), HALF=d // 2,
                            BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(d // 2), **EXACT)
    return x


@triton.jit
def _swiglu_kernel(gate_up_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_up_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if LIBDEVICE_EXP:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    act = tl.div_rn(gate, 1.0 + e).to(out_ptr.dtype.element_ty).to(tl.float32)  # torch's silu, rounded as torch's
    tl.store(out_ptr + row * n_cols + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for the merged projection's output [rows, 2 * ffn] -> [rows, ffn]."""
    rows, two_f = gate_up.shape
    f = two_f // 2
    out = torch.empty(rows, f, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(f))
    _swiglu_kernel[(rows, triton.cdiv(f, block))](gate_up.contiguous(), out, f, BLOCK=block,
                                                  LIBDEVICE_EXP=LIBDEVICE_EXP, **EXACT)
    return out


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, rows_ptr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    entry = tl.program_id(0)  # one (token, KV head)
    row = tl.load(rows_ptr + entry)
    if row >= 0:  # a negative row is padding: nothing to write
        cols = tl.arange(0, BLOCK)
        mask = cols < HEAD_DIM
        tl.store(k_cache_ptr + row * HEAD_DIM + cols, tl.load(k_ptr + entry * HEAD_DIM + cols, mask=mask), mask=mask)
        tl.store(v_cache_ptr + row * HEAD_DIM + cols, tl.load(v_ptr + entry * HEAD_DIM + cols, mask=mask), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             rows: torch.Tensor) -> None:
    """Write k, v [tokens, kv_heads, d] into caches [blocks, kv_heads, block_size, d]: ``rows`` [tokens, kv_heads]
    is each (token, head)'s row of the cache viewed as [blocks * kv_heads * block_size, d]."""
    tokens, kvh, d = k.shape
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and rows.shape == (tokens, kvh)
    _store_kv_kernel[(tokens * kvh,)](k.contiguous(), v.contiguous(), k_cache, v_cache, rows.contiguous(),
                                      HEAD_DIM=d, BLOCK=triton.next_power_of_2(d))

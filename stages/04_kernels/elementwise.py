"""Fused element-wise kernels: each reads its inputs once and writes its outputs once.

Unfused, ``residual + x`` then RMSNorm reads and writes the hidden state several times
(add, square, mean, scale, multiply); RoPE builds ``rotate_half`` copies; SwiGLU
writes ``silu(gate)`` before multiplying by ``up``. Decoding is bound by memory
traffic, so one pass per operation is the saving. Arithmetic is in float32 after
loading (also what keeps the Triton interpreter correct for bfloat16).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, HAS_RESIDUAL: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    x = x.to(res_ptr.dtype.element_ty)  # the residual stream keeps the model's dtype
    tl.store(res_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(RMSNorm(x + residual) * weight, x + residual), the sum written into ``residual`` in place
    (vLLM's fused_add_rms_norm); with no residual, x itself is the residual stream."""
    rows, n = x.shape
    assert x.is_contiguous() and (residual is None or residual.is_contiguous())
    if residual is None:
        residual = x
    out = torch.empty_like(x)
    _add_rms_norm_kernel[(rows,)](x, residual, weight, out, n, eps, HAS_RESIDUAL=residual is not x,
                                  BLOCK=triton.next_power_of_2(n))
    return out, residual


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, n_heads, stride_tok, stride_head, HALF: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < n_heads) & (dims < HALF)
    # The tables are (cos, cos) and (-sin, sin) per token (common.ops.rope_tables): x * cos + roll(x) * sin.
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
    the per-token tables of ``common.ops.rope_tables``."""
    tokens, heads, d = x.shape
    assert x.stride(2) == 1 and d % 2 == 0
    cos, sin = cos.reshape(tokens, d).contiguous(), sin.reshape(tokens, d).contiguous()
    _rope_kernel[(tokens,)](x, cos, sin, heads, x.stride(0), x.stride(1), HALF=d // 2,
                            BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(d // 2))
    return x


@triton.jit
def _swiglu_kernel(gate_up_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_up_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)  # silu, rounded as torch's
    tl.store(out_ptr + row * n_cols + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for the merged projection's output [rows, 2 * ffn] -> [rows, ffn]."""
    rows, two_f = gate_up.shape
    f = two_f // 2
    out = torch.empty(rows, f, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(f))
    _swiglu_kernel[(rows, triton.cdiv(f, block))](gate_up.contiguous(), out, f, BLOCK=block)
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

"""The model's element-wise math, written so that a fused kernel can reproduce every bit.

Stage 04 replaces these functions with fused kernels (code ``torch.compile`` generates on
CPU, hand-written Triton on CUDA), and must still give the reference's tokens. So every
rounding here is spelled out:

* only operations whose result is defined by IEEE 754 to the last bit on every device:
  add, subtract, multiply, divide and casts; no multiply-add is contracted into one rounding;
* the square root is taken in float64 and rounded to float32, which gives the correctly
  rounded float32 root: torch's own float32 ``sqrt`` on CPU goes through a vector-math
  library that is one unit in the last place off for about 1 value in 170 (0.6% of 20M
  values checked), and ``rsqrt`` is approximate on CUDA;
* a reduction has one order: RMSNorm's sum of squares adds each 16-wide lane of a row in
  order, then the lanes in order, in float64 (``cumsum`` is a sequential scan on CPU and
  CUDA), and is rounded to float32 once;
* ``silu`` is torch's own kernel (``x / (1 + exp(-x))``), the one function with an ``exp``.

Intermediate results are rounded to the model's dtype exactly where torch's eager code
rounds them (a fused kernel must round there too: ``emulate_precision_casts`` in
inductor, explicit casts in Triton).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

LANES = 16  # RMSNorm sums a row's squares in this many interleaved lanes


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual): the residual stream is added into, then normalized.

    x, residual: [rows, hidden] in the model dtype; with no residual, x is the residual stream."""
    residual = x if residual is None else x + residual
    xf = residual.float()
    rows, hidden = xf.shape
    lanes = (xf * xf).view(rows, hidden // LANES, LANES).cumsum(1, dtype=torch.float64)[:, -1]  # [rows, LANES]
    # the lanes summed as an outer dimension ([rows, LANES, 1]): a sequential scan on CUDA too, not a tree
    sum_sq = lanes.unsqueeze(-1).cumsum(1)[:, -1].float()  # [rows, 1]
    root = torch.sqrt((sum_sq / hidden + eps).double()).float()  # the correctly rounded float32 root
    normed = (xf / root).to(x.dtype)
    return weight * normed, residual


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [tokens, head_dim / 2] at the step's positions -> the [tokens, 1, head_dim] factors ``rope`` takes:
    (cos, cos) and (-sin, sin), so the rotation is ``x * cos + swap_halves(x) * sin`` (negating is exact)."""
    return torch.cat([cos, cos], -1).unsqueeze(1), torch.cat([-sin, sin], -1).unsqueeze(1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [tokens, heads, head_dim] (the rotate-half layout) in float32: with x = (x1, x2) by halves,
    (x1 * cos - x2 * sin, x2 * cos + x1 * sin); cos, sin as ``rope_tables`` makes them."""
    xf = x.float()
    return (xf * cos + xf.roll(x.shape[-1] // 2, -1) * sin).to(x.dtype)  # roll by half: the halves swapped


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for the merged projection's output [rows, 2 * ffn] -> [rows, ffn]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
             num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the merged projection's output [tokens, (heads + 2 * kv_heads) * head_dim] into q, k, v
    ([tokens, heads or kv_heads, head_dim]), q and k rotated by RoPE in one pass."""
    tokens = qkv.shape[0]
    d = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    qk = rope(qkv[:, :(num_heads + num_kv_heads) * d].view(tokens, num_heads + num_kv_heads, d), cos, sin)
    return qk[:, :num_heads], qk[:, num_heads:], qkv[:, (num_heads + num_kv_heads) * d:].view(tokens, num_kv_heads, d)

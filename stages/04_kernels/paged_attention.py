"""Paged decode attention, flash-decoding style, with a fixed split size.

One query token per sequence reads its whole context through the block table.
A long context is cut into splits of ``SPLIT_SIZE`` tokens that run in parallel
(one program per sequence x KV head x split), each keeping an online softmax;
a second kernel merges a sequence's splits in order with their log-sum-exp.

Why a fixed split *size*: with a fixed *number* of splits, a sequence's split
boundaries (and so its rounding) would change with the longest sequence in the
batch. With a fixed size they depend only on the sequence's own length, and the
merge walks the splits in order, so a result never depends on the batch.

Grouped-query attention: the query heads that share a KV head are one tile of
rows (padded to 16, the smallest ``tl.dot`` tile), so each key and value is read
once per KV head, not once per query head.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT_SIZE = 256  # tokens per split (a multiple of BLOCK_N)
BLOCK_N = 16  # keys per inner iteration
BLOCK_G = 16  # query rows per KV head, padded: tl.dot needs M >= 16


@triton.jit
def _split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, ctx_ptr, part_o_ptr, part_lse_ptr,
                  scale, max_blocks, max_splits, GROUP: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    start = split * SPLIT
    if start < ctx:
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        gmask, dmask = g < GROUP, d < HEAD_DIM
        heads = kv_head * GROUP + g
        num_heads = NUM_KV_HEADS * GROUP
        q = tl.load(q_ptr + (seq * num_heads + heads)[:, None] * HEAD_DIM + d[None, :],
                    mask=gmask[:, None] & dmask[None, :], other=0.0).to(tl.float32) * scale
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        # A fixed trip count (bounds from loaded values break triton 3.6's interpreter); iterations past the
        # context are fully masked, which leaves m, l and acc exactly as they were.
        for n0 in range(0, SPLIT, BLOCK_N):
            toks = start + n0 + tl.arange(0, BLOCK_N)
            tmask = toks < ctx
            block = tl.load(tables_ptr + seq * max_blocks + toks // BLOCK_SIZE, mask=tmask, other=0)
            rows = (block * NUM_KV_HEADS + kv_head) * BLOCK_SIZE + toks % BLOCK_SIZE
            kv_mask = tmask[:, None] & dmask[None, :]
            k = tl.load(k_cache_ptr + rows[:, None] * HEAD_DIM + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + rows[:, None] * HEAD_DIM + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            m = m_new
        out = (seq * num_heads + heads) * max_splits + split
        tl.store(part_o_ptr + out[:, None] * HEAD_DIM + d[None, :], acc / l[:, None],
                 mask=gmask[:, None] & dmask[None, :])
        tl.store(part_lse_ptr + out, m + tl.log(l), mask=gmask)


@triton.jit
def _merge_kernel(part_o_ptr, part_lse_ptr, out_ptr, MAX_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    seq, head, num_heads = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    row = (seq * num_heads + head) * MAX_SPLITS
    m = tl.load(part_lse_ptr + row)
    acc = tl.load(part_o_ptr + row * HEAD_DIM + d, mask=dmask, other=0.0)
    total = 1.0
    for i in range(1, MAX_SPLITS):  # in order; splits past this sequence's own are exact no-ops
        lse = tl.load(part_lse_ptr + row + i)  # -inf (and o = 0) where the sequence has no such split
        o = tl.load(part_o_ptr + (row + i) * HEAD_DIM + d, mask=dmask, other=0.0)
        m_new = tl.maximum(m, lse)
        a, b = tl.exp(m - m_new), tl.exp(lse - m_new)
        acc = acc * a + o * b
        total = total * a + b
        m = m_new
    tl.store(out_ptr + (seq * num_heads + head) * HEAD_DIM + d, (acc / total).to(out_ptr.dtype.element_ty),
             mask=dmask)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, max_context: int,
                           split_size: int = SPLIT_SIZE) -> torch.Tensor:
    """q [seqs, heads, d] (one decode token each); caches [blocks, kv_heads, block_size, d];
    block_tables [seqs, max_blocks] int32; context_lens [seqs] (the new token included)."""
    seqs, heads, d = q.shape
    _, kv_heads, block_size, _ = k_cache.shape
    group = heads // kv_heads
    assert group <= BLOCK_G and split_size % BLOCK_N == 0
    max_splits = triton.cdiv(max_context, split_size)
    # Splits a sequence does not have stay (lse -inf, output 0): merging them changes nothing.
    part_o = torch.zeros(seqs, heads, max_splits, d, dtype=torch.float32, device=q.device)
    part_lse = torch.full((seqs, heads, max_splits), float("-inf"), dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(d))
    _split_kernel[(seqs, kv_heads, max_splits)](
        q.contiguous(), k_cache, v_cache, block_tables, context_lens, part_o, part_lse, d ** -0.5,
        block_tables.shape[1], max_splits, GROUP=group, NUM_KV_HEADS=kv_heads, HEAD_DIM=d, BLOCK_SIZE=block_size,
        SPLIT=split_size, BLOCK_N=BLOCK_N, BLOCK_G=BLOCK_G, BLOCK_D=block_d)
    out = torch.empty_like(q)
    # MAX_SPLITS is a compile-time constant (a loop bound the triton 3.6 interpreter accepts): a few variants.
    _merge_kernel[(seqs, heads)](part_o, part_lse, out, MAX_SPLITS=max_splits, HEAD_DIM=d, BLOCK_D=block_d)
    return out

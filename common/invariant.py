"""Batch-invariant building blocks: a row's result never depends on its neighbours.

Why this module exists
----------------------
Every stage must produce exactly the tokens of the one-request-at-a-time
reference. Batching changes the *shapes* the math runs on, and on CPU the
matrix-multiply library picks a different kernel (different summation order,
different bits) for different shapes: on the machine this was built on,
``X[:M] @ W.T`` differed from ``(X @ W.T)[:M]`` for many M, in float32 *and*
bfloat16 (checked for shapes 576x576, 1536x576, 576x1536 and 49152x576). A one-bit difference in a
logit flips a greedy tie sooner or later, so "close" is not enough.

The fix is in the design, not the tests: every matrix multiply runs on one
fixed shape, whatever the batch.

* ``linear`` pads the rows to a multiple of ``ROW_TILE`` and multiplies one
  ``ROW_TILE``-row tile at a time. The kernel then always sees the same shape,
  and a row's bits depend only on the row.
* ``attention`` computes each (sequence, KV head)'s scores in tiles of
  ``QUERY_TILE`` query rows x ``KEY_TILE`` keys with an online softmax that
  walks the key tiles in order (flash-attention's recurrence). A fully masked
  tile is an exact no-op (scale 1, add 0), so padding a sequence's keys or
  batching it with longer ones cannot change its result.
* Element-wise maths that uses ``exp`` is vectorised on whole multiples of the
  SIMD width and scalar on the tail, and the two can differ by one bit; the
  padded shapes above keep every such tensor a multiple of 64 elements per row
  block, so a value never moves between the two paths.

The same code runs the reference and every stage, so "same tokens" reduces to
"same per-row inputs", which the stages guarantee by construction. On CUDA the
same tiling applies (cuBLAS also picks kernels by shape).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ROW_TILE = 16  # rows per matmul in `linear`
QUERY_TILE = 16  # query rows (token x grouped head) per attention tile
KEY_TILE = 64  # keys per attention tile
TILE_GROUP = 16  # attention tiles are padded to a multiple of this (keeps exp on full vectors)


def pad_rows(x: torch.Tensor, multiple: int = ROW_TILE) -> torch.Tensor:
    pad = (-x.shape[0]) % multiple
    return torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x


def linear(x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``x @ weight_t`` for ``x`` with a multiple of ROW_TILE rows, one fixed-shape tile at a time."""
    rows = x.shape[0]
    assert rows % ROW_TILE == 0, "pad the rows first (pad_rows)"
    out = x.new_empty(rows, weight_t.shape[1])
    for i in range(0, rows, ROW_TILE):
        torch.mm(x[i:i + ROW_TILE], weight_t, out=out[i:i + ROW_TILE])
    return out


@dataclass
class AttentionMetadata:
    """Where each query row of a step goes and where its keys live: built once per step, used by every layer.

    The flattened step holds, for sequence ``s``, ``query_lens[s]`` new tokens at
    positions ``context_lens[s] - query_lens[s] ...``. Keys and values are read
    through ``key_index``: row ``s * kv_heads + h``, column ``p`` is the row of the
    flattened K/V storage ([N, d]) that holds sequence ``s``'s key/value of head
    ``h`` at position ``p``. A contiguous cache and a paged one differ only there.
    """
    query_lens: list[int]
    context_lens: list[int]
    row_src: torch.Tensor  # [tiles * QUERY_TILE] index into q viewed as [tokens * heads, d]
    row_pos: torch.Tensor  # [tiles, QUERY_TILE] position of each row's token
    tile_stream: torch.Tensor  # [tiles] row of key_index: sequence * kv_heads + head
    valid: torch.Tensor  # [rows] bool: a real row (not padding)
    tile_last_pos: torch.Tensor  # [tiles] the furthest position any row of the tile may attend to
    key_tiles: int  # tiles of KEY_TILE keys covering the longest context
    key_index: torch.Tensor  # [seqs * kv_heads, key_tiles * KEY_TILE] rows of the K/V storage

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], num_heads: int,
              num_kv_heads: int, key_index: torch.Tensor) -> "AttentionMetadata":
        group = num_heads // num_kv_heads
        src, pos, stream, valid = [], [], [], []
        token0 = 0
        for s, (n, ctx) in enumerate(zip(query_lens, context_lens)):
            tok = torch.arange(token0, token0 + n).repeat_interleave(group)  # token-major rows
            head_in_group = torch.arange(group).repeat(n)
            tok_pos = tok - token0 + (ctx - n)
            pad = (-tok.numel()) % QUERY_TILE
            for h in range(num_kv_heads):
                rows = tok * num_heads + h * group + head_in_group
                # Padding rows copy the sequence's first row: finite, and thrown away.
                src.append(torch.cat([rows, rows[:1].expand(pad)]))
                pos.append(torch.cat([tok_pos, tok_pos[:1].expand(pad)]))
                valid.append(torch.arange(rows.numel() + pad) < rows.numel())
                stream.append(torch.full(((rows.numel() + pad) // QUERY_TILE,), s * num_kv_heads + h))
            token0 += n
        src, pos, stream, valid = torch.cat(src), torch.cat(pos), torch.cat(stream), torch.cat(valid)
        pad_tiles = (-stream.numel()) % TILE_GROUP
        if pad_tiles:
            src = torch.cat([src, src.new_zeros(pad_tiles * QUERY_TILE)])
            pos = torch.cat([pos, pos.new_zeros(pad_tiles * QUERY_TILE)])
            valid = torch.cat([valid, valid.new_zeros(pad_tiles * QUERY_TILE)])
            stream = torch.cat([stream, stream[:1].expand(pad_tiles)])
        key_tiles = -(-max(context_lens) // KEY_TILE)
        assert key_index.shape == (len(query_lens) * num_kv_heads, key_tiles * KEY_TILE), key_index.shape
        pos = pos.view(-1, QUERY_TILE)
        dev = key_index.device
        return cls(list(query_lens), list(context_lens), src.to(dev), pos.to(dev), stream.to(dev),
                   valid.to(dev), pos.amax(1).to(dev), key_tiles, key_index)


def key_tiles_len(context_lens: list[int]) -> int:
    """Positions the attention reads per sequence: the longest context, rounded up to whole key tiles."""
    return -(-max(context_lens) // KEY_TILE) * KEY_TILE


def contiguous_key_index(slots: list[int], num_kv_heads: int, row_len: int, key_len: int,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """key_index for storage shaped [slots, kv_heads, row_len, d]: (slot, head, p) -> flat row."""
    streams = (torch.tensor(slots)[:, None] * num_kv_heads + torch.arange(num_kv_heads)).view(-1, 1)
    return (streams * row_len + torch.arange(key_len)).to(device)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Causal grouped-query attention for a flattened step.

    q: [tokens, heads, d]; k, v: the cache's storage flattened to [N, d], read through
    ``meta.key_index`` (what lies past a sequence's length is masked and never enters the
    result, but must be finite). Returns [tokens, heads, d] in q's dtype.
    """
    tokens, heads, d = q.shape
    qt = q.reshape(tokens * heads, d)[meta.row_src].float().view(-1, QUERY_TILE, d) * d ** -0.5
    tiles = qt.shape[0]
    m = torch.full((tiles, QUERY_TILE), float("-inf"), device=q.device)
    l = torch.zeros(tiles, QUERY_TILE, device=q.device)
    acc = torch.zeros(tiles, QUERY_TILE, d, device=q.device)
    key_offsets = torch.arange(KEY_TILE, device=q.device)
    for t in range(meta.key_tiles):
        lo = t * KEY_TILE
        # Tiles whose rows all end before this key tile would be an exact no-op: skip them.
        active = torch.nonzero(meta.tile_last_pos >= lo).squeeze(1)
        if active.numel() == 0:
            break
        pad = (-active.numel()) % TILE_GROUP  # keep exp on whole vectors (see module doc)
        if pad:
            active = torch.cat([active, active[-1:].expand(pad)])
        rows = meta.key_index[meta.tile_stream[active], lo:lo + KEY_TILE]
        kt, vt = k[rows].float(), v[rows].float()
        m_a, l_a, acc_a = m[active], l[active], acc[active]
        s = torch.bmm(qt[active], kt.transpose(1, 2))
        s.masked_fill_((lo + key_offsets) > meta.row_pos[active][:, :, None], float("-inf"))
        m_new = torch.maximum(m_a, s.amax(-1))
        alpha = torch.exp(m_a - m_new)
        p = torch.exp(s - m_new[:, :, None])
        # Duplicated padding tiles write identical values, so the scatter is well defined.
        l[active] = l_a * alpha + p.sum(-1)
        acc[active] = acc_a * alpha[:, :, None] + torch.bmm(p, vt)
        m[active] = m_new
    out_rows = (acc / l[:, :, None]).view(-1, d)
    out = torch.empty(tokens * heads, d, dtype=q.dtype, device=q.device)
    out[meta.row_src[meta.valid]] = out_rows[meta.valid].to(q.dtype)
    return out.view(tokens, heads, d)

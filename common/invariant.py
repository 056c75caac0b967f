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

* ``Linear`` multiplies fixed-size row tiles, so a row's bits depend only on
  the row. In bfloat16 on CPU the weight is prepacked once into oneDNN's
  blocked layout (what ``torch.compile``'s freezing does) and called on up to
  ``PACKED_TILE`` (32) rows at a time; checked on the build machine: a row's
  result is the same alone or in any call of up to 32 rows, for every SmolLM2
  shape, and prepacking skips the re-layout of the whole weight that a plain
  ``torch.mm`` does on every call (about 2.5x faster for the LM head). float32
  prepacked is *not* row-invariant there (the down projection differs past one
  row), so float32 and other devices use ``torch.mm`` on tiles of exactly
  ``ROW_TILE`` (16) rows, checked the same way.
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

import numpy as np
import torch

ROW_TILE = 16  # activations are padded to a multiple of this; torch.mm runs on tiles of exactly this many rows
PACKED_TILE = 32  # rows per prepacked oneDNN call (any count up to it gives every row the same bits)
QUERY_TILE = 8  # query rows (token x grouped head) per attention tile
KEY_TILE = 64  # keys per attention tile
TILE_GROUP = 16  # attention tiles are padded to a multiple of this (keeps exp on full vectors)


def pad_rows(x: torch.Tensor, multiple: int = ROW_TILE) -> torch.Tensor:
    pad = (-x.shape[0]) % multiple
    return torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x


class Linear:
    """``x @ weight.T`` on fixed-shape row tiles; ``weight`` is [out_features, in_features]."""

    def __init__(self, weight: torch.Tensor):
        self.out_features, self.in_features = weight.shape
        self.nbytes = weight.numel() * weight.element_size()
        self.packed = None
        if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACKED_TILE)
            self.weight_t = None
        else:
            self.weight_t = weight.t().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        assert rows % ROW_TILE == 0, "pad the rows first (pad_rows)"
        x = x.contiguous()
        if self.packed is not None:
            parts = [torch.ops.mkldnn._linear_pointwise(x[i:i + PACKED_TILE], self.packed, None, "none", [], "")
                     for i in range(0, rows, PACKED_TILE)]
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        out = x.new_empty(rows, self.out_features)
        for i in range(0, rows, ROW_TILE):
            torch.mm(x[i:i + ROW_TILE], self.weight_t, out=out[i:i + ROW_TILE])
        return out


@dataclass
class AttentionMetadata:
    """Where each query row of a step goes and where its keys live: built once per step, used by every layer.

    The flattened step holds, for sequence ``s``, ``query_lens[s]`` new tokens at
    positions ``context_lens[s] - query_lens[s] ...``. Keys and values are read
    through ``key_index``: row ``s * kv_heads + h``, column ``p`` is the row of the
    flattened K/V storage ([N, d]) that holds sequence ``s``'s key/value of head
    ``h`` at position ``p``. A contiguous cache and a paged one differ only there.

    Query tiles are sorted by how far they reach, so the tiles still active at key
    tile ``t`` are a prefix ``[:n_t]``: the loop slices instead of gathering.
    """
    query_lens: list[int]
    context_lens: list[int]
    row_src: torch.Tensor  # [tiles * QUERY_TILE] index into q viewed as [tokens * heads, d]
    valid: torch.Tensor  # [rows] bool: a real row (not padding)
    key_index: torch.Tensor  # [seqs * kv_heads, key_tiles * KEY_TILE] rows of the K/V storage
    plan: list[tuple[int, torch.Tensor, torch.Tensor]]  # per key tile: (n_t, K/V rows [n_t, KEY_TILE], mask)

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], num_heads: int,
              num_kv_heads: int, key_index: torch.Tensor) -> "AttentionMetadata":
        group = num_heads // num_kv_heads
        src, pos, stream, valid = [], [], [], []
        token0 = 0
        for s, (n, ctx) in enumerate(zip(query_lens, context_lens)):
            tok = np.repeat(np.arange(token0, token0 + n), group)  # token-major rows
            head_in_group = np.tile(np.arange(group), n)
            tok_pos = tok - token0 + (ctx - n)
            pad = (-tok.size) % QUERY_TILE
            for h in range(num_kv_heads):
                rows = tok * num_heads + h * group + head_in_group
                # Padding rows copy the sequence's first row: finite, and thrown away.
                src.append(np.concatenate([rows, np.repeat(rows[:1], pad)]))
                pos.append(np.concatenate([tok_pos, np.repeat(tok_pos[:1], pad)]))
                valid.append(np.arange(rows.size + pad) < rows.size)
                stream.append(np.full((rows.size + pad) // QUERY_TILE, s * num_kv_heads + h))
            token0 += n
        src, pos, stream, valid = map(np.concatenate, (src, pos, stream, valid))
        pad_tiles = (-stream.size) % TILE_GROUP
        src = np.concatenate([src, np.zeros(pad_tiles * QUERY_TILE, dtype=src.dtype)])
        pos = np.concatenate([pos, np.zeros(pad_tiles * QUERY_TILE, dtype=pos.dtype)]).reshape(-1, QUERY_TILE)
        valid = np.concatenate([valid, np.zeros(pad_tiles * QUERY_TILE, dtype=bool)]).reshape(-1, QUERY_TILE)
        stream = np.concatenate([stream, np.repeat(stream[:1], pad_tiles)])
        order = np.argsort(-pos.max(1), kind="stable")  # the furthest-reaching tiles first
        src, pos, valid, stream = src.reshape(-1, QUERY_TILE)[order], pos[order], valid[order], stream[order]
        last = pos.max(1)
        key_tiles = -(-max(context_lens) // KEY_TILE)
        assert key_index.shape == (len(query_lens) * num_kv_heads, key_tiles * KEY_TILE), key_index.shape
        dev = key_index.device
        pos_t, stream_t = torch.from_numpy(pos).to(dev), torch.from_numpy(stream).to(dev)
        offsets = torch.arange(KEY_TILE, device=dev)
        plan = []
        for t in range(key_tiles):
            lo = t * KEY_TILE
            # Tiles whose rows all end before this key tile would be an exact no-op: leave them out. Rounding the
            # count up to TILE_GROUP keeps exp on whole vectors; the extra tiles are exact no-ops.
            n = int((last >= lo).sum())
            if n == 0:
                break
            n = min(len(last), -(-n // TILE_GROUP) * TILE_GROUP)
            plan.append((n, key_index[stream_t[:n], lo:lo + KEY_TILE], (lo + offsets) > pos_t[:n, :, None]))
        return cls(list(query_lens), list(context_lens), torch.from_numpy(src.reshape(-1)).to(dev),
                   torch.from_numpy(valid.reshape(-1)).to(dev), key_index, plan)


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
    for n, rows, mask in meta.plan:  # key tiles in order: the online softmax
        kt, vt = k[rows].float(), v[rows].float()
        s = torch.bmm(qt[:n], kt.transpose(1, 2))
        s.masked_fill_(mask, float("-inf"))
        m_old = m[:n]
        m_new = torch.maximum(m_old, s.amax(-1))
        alpha = torch.exp(m_old - m_new)
        p = torch.exp(s - m_new[:, :, None])
        l[:n] = l[:n] * alpha + p.sum(-1)
        acc[:n] = acc[:n] * alpha[:, :, None] + torch.bmm(p, vt)
        m[:n] = m_new
    out_rows = (acc / l[:, :, None]).view(-1, d)
    out = torch.empty(tokens * heads, d, dtype=q.dtype, device=q.device)
    out[meta.row_src[meta.valid]] = out_rows[meta.valid].to(q.dtype)
    return out.view(tokens, heads, d)

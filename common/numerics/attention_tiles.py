"""Batch-invariant attention from a fixed number of tensor operations: the version that runs off CPU
(CUDA), where no C++ compiler builds the native kernel, or with ``STEPWISE_NATIVE_ATTENTION=0``.

The tensor-op version. Invariance needs one thing: the order in which each row's reductions run (over the
head dimension for a score, over keys for the softmax sum and for P·V) must not depend
on what else is in the step. So keys are cut into tiles of ``KEY_TILE`` positions,
always at the same boundaries (0-63, 64-127, ...), and every reduction runs over one
tile or over the tiles in order:

1. The step's query rows are grouped into *query tiles* (one stream = one sequence's
   rows for one KV head), and each query tile is paired with every key tile it can
   reach. One ``bmm`` over all pairs gives the scores, ``[pairs, rows, KEY_TILE]``;
   its reduction over the head dimension has one fixed length, and the matmul gives
   a row the same bits whatever the number of pairs (checked with the row counts,
   ``decode_tile_rows``).
2. Each row's maximum over all its pairs (a max is exact in any order), then
   ``p = exp((s - max) * scale)``, its per-tile sum, and a second ``bmm`` per pair:
   ``P·V`` over one key tile.
3. The per-tile partial sums are combined with ``cumsum`` along the key-tile axis,
   a sequential scan on CPU and on CUDA (a scan over an outer dimension), so the
   sum runs in key order; a tile a row cannot see holds exact zeros, and adding zeros
   changes nothing. Padding, batching and chunked prefill therefore cannot change a bit.

Two kinds of query tile keep the gathered K/V small: a decoding sequence has one token
per stream (a tile of ``group`` rows), a prefilling one has tiles of up to
``QUERY_TOKENS`` tokens (so a long prompt gathers each key tile once per 64 tokens, not
once per token). A prefill tile always has ``QUERY_TOKENS * group`` rows (padded), and a decode
tile the fewest rows, at least ``group``, at which ``bmm`` gives each row the bits it gets in a
prefill tile: float32 ``bmm`` takes a matrix-vector path, with other bits, at up to two rows on one
CPU and up to three on another, so the count is checked once per process on the machine that runs
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.numerics import invariant

KEY_TILE = 64  # keys per tile: the fixed reduction length of both matmuls
QUERY_TOKENS = 64  # tokens per query tile of a prefilling sequence
SLICE_SLOTS = 2048  # (query tile, key tile) slots attended at once: bounds the scores an 8k prefill holds
_decode_rows: dict[tuple, int] = {}  # (device type, group, head_dim, cache dtype) -> rows of a decode tile


@dataclass
class TileGroup:
    """One kind of query tile (decode or prefill), laid out for the layer's tensor ops."""
    rows: int  # query rows per tile (padded)
    tiles: int  # number of query tiles
    max_key_tiles: int  # the most key tiles any query tile reaches
    pair_rows: torch.Tensor  # [pairs, rows]: the q row (of q viewed [tokens * heads, d]) each tile row reads
    pair_chunks: torch.Tensor  # [pairs, KEY_TILE // chunk_len]: K/V chunks of the pair's key tile
    pair_tile: torch.Tensor  # [pairs]: the pair's query tile
    pair_tile_rows: torch.Tensor  # [pairs, rows]: pair_tile expanded (the scatter index of the row max)
    pair_slot: torch.Tensor  # [pairs]: tile * max_key_tiles + key tile, its place in the key-ordered sum
    masked: torch.Tensor  # [pairs, rows, KEY_TILE] bool: key after the row's position (or past the context)


def build_tile_groups(query_lens, context_lens, num_heads, num_kv_heads, chunk_table, chunk_len, head_stride,
                      device, head_dim: int, kv_dtype: torch.dtype) -> tuple[list[TileGroup], torch.Tensor | None]:
    """The step's query tiles (decode and prefill kinds), and where each output row goes (None: in order)."""
    n, ctx = np.asarray(query_lens), np.asarray(context_lens)
    first_token = np.concatenate([[0], np.cumsum(n)[:-1]])
    geometry = (num_heads, num_kv_heads, chunk_table, chunk_len, head_stride)
    decode_rows = decode_tile_rows(torch.device(device), num_heads // num_kv_heads, head_dim, kv_dtype)
    groups, out_rows = [], []
    for seqs, tile_tokens in ((np.flatnonzero(n == 1), 1), (np.flatnonzero(n > 1), QUERY_TOKENS)):
        if seqs.size:
            group, q_rows = _tile_group(seqs, n, ctx, first_token, tile_tokens, decode_rows, geometry, device)
            groups.append(group)
            out_rows.append(q_rows)
    # Invert "tile row -> q row" so the output is gathered in q's row order with one index_select
    # (not needed when the tiles already are in that order: a decode-only step).
    q_rows = np.concatenate(out_rows)
    out_index = np.empty(int(n.sum()) * num_heads, dtype=np.int64)
    valid = q_rows >= 0
    out_index[q_rows[valid]] = np.flatnonzero(valid)
    in_order = out_index.size == q_rows.size and np.array_equal(out_index, np.arange(out_index.size))
    return groups, None if in_order else torch.from_numpy(out_index).to(device)


def _tile_group(seqs, n, ctx, first_token, tile_tokens, decode_rows, geometry, device) -> tuple[TileGroup, np.ndarray]:
    """Query tiles of ``tile_tokens`` tokens for sequences ``seqs``, paired with the key tiles they reach."""
    num_heads, kvh, chunk_table, chunk_len, head_stride = geometry
    group = num_heads // kvh
    rows = tile_tokens * group if tile_tokens > 1 else decode_rows
    # Tiles of one KV head: (sequence, first token of the tile, tokens in it).
    per_seq = -(-n[seqs] // tile_tokens)
    seq = np.repeat(seqs, per_seq)
    start = (np.arange(per_seq.sum()) - np.repeat(np.cumsum(per_seq) - per_seq, per_seq)) * tile_tokens
    count = np.minimum(tile_tokens, n[seq] - start)
    r = np.arange(rows)
    token, head_in_group = r // group, r % group
    valid = token[None, :] < count[:, None]  # [tiles, rows]
    token = np.where(valid, token[None, :], 0) + start[:, None]  # padding rows repeat the tile's first row
    pos = ctx[seq][:, None] - n[seq][:, None] + token  # [tiles, rows]
    reach = (ctx[seq] - n[seq] + start + count - 1) // KEY_TILE + 1  # key tiles each tile reaches
    # Every KV head gets its own copy of the tiles: tile index = t * kvh + h.
    heads = np.arange(kvh)
    q_rows = ((first_token[seq][:, None, None] + token[:, None, :]) * num_heads
              + heads[None, :, None] * group + np.where(valid, head_in_group, 0)[:, None, :])  # [tiles, kvh, rows]
    tiles = q_rows.shape[0] * kvh
    q_rows = q_rows.reshape(tiles, rows)
    reach = np.repeat(reach, kvh)
    tile_seq, tile_head = np.repeat(seq, kvh), np.tile(heads, seq.size)
    # Pairs: (query tile, key tile) for every key tile the query tile reaches, in key order.
    pair_tile = np.repeat(np.arange(tiles), reach)
    key_tile = np.arange(reach.sum()) - np.repeat(np.cumsum(reach) - reach, reach)
    per_tile = KEY_TILE // chunk_len
    chunk = key_tile[:, None] * per_tile + np.arange(per_tile)  # [pairs, per_tile] chunk positions
    table = chunk_table[tile_seq[pair_tile]]
    inside = chunk < table.shape[1]
    chunks = np.where(inside, np.take_along_axis(table, np.minimum(chunk, table.shape[1] - 1), 1), 0)
    chunks = np.where(inside, chunks + (tile_head[pair_tile] * head_stride)[:, None], 0)
    key_pos = key_tile[:, None] * KEY_TILE + np.arange(KEY_TILE)  # [pairs, KEY_TILE]
    tile_pos = np.repeat(pos, kvh, axis=0)
    masked = key_pos[:, None, :] > tile_pos[pair_tile][:, :, None]  # past the row's own position
    max_reach = int(reach.max())
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    out = np.where(np.repeat(valid, kvh, axis=0), q_rows, -1).reshape(-1)
    return TileGroup(rows, tiles, max_reach, t(q_rows[pair_tile]), t(chunks), t(pair_tile),
                     t(np.broadcast_to(pair_tile[:, None], (pair_tile.size, rows))),
                     t(pair_tile * max_reach + key_tile), t(masked)), out


def decode_tile_rows(device: torch.device, group: int, head_dim: int, kv_dtype: torch.dtype) -> int:
    """Rows of a decode tile: the fewest, from ``group`` up, at which both ``bmm`` (float32 scores, P·V in the
    cache's dtype) give every row, wherever it sits, the bits it gets in a prefill tile of this machine. Rows whose
    products partly cancel make a change of summation order show in the rounded result."""
    key = (device.type, group, head_dim, kv_dtype)
    if key not in _decode_rows:
        full = QUERY_TOKENS * group
        q = invariant.order_revealing_rows(2 * full, head_dim, seed=1).view(2, full, head_dim).to(device)
        k = invariant.order_revealing_rows(2 * KEY_TILE, head_dim, seed=2).view(2, KEY_TILE, head_dim).to(device)
        p = invariant.order_revealing_rows(2 * full, KEY_TILE, seed=3).view(2, full, KEY_TILE).to(device, kv_dtype)
        v = invariant.order_revealing_rows(2 * head_dim, KEY_TILE, seed=4).view(2, head_dim, KEY_TILE)
        v = v.transpose(1, 2).contiguous().to(device, kv_dtype)
        products = ((q, k.transpose(1, 2)), (p, v))
        expected = [torch.bmm(a, b) for a, b in products]

        def same_bits(rows: int) -> bool:
            return all(torch.equal(torch.bmm(a[pairs, at:at + rows].contiguous(), b[pairs]), e[pairs, at:at + rows])
                       for (a, b), e in zip(products, expected) for at in (0, full - rows)
                       for pairs in (slice(0, 2), slice(1, 2)))

        _decode_rows[key] = next((rows for rows in range(group, full) if same_bits(rows)), full)
    return _decode_rows[key]


def attend_tiles(q: torch.Tensor, k_chunks: torch.Tensor, v_chunks: torch.Tensor, groups: list[TileGroup],
                 out_index: torch.Tensor | None) -> torch.Tensor:
    tokens, heads, d = q.shape
    q_flat = q.reshape(tokens * heads, d).float()  # scores are computed in float32
    k_flat, v_flat = k_chunks.reshape(-1, k_chunks.shape[1] * d), v_chunks.reshape(-1, v_chunks.shape[1] * d)
    outs = [_attend(q_flat, k_flat, v_flat, g, d) for g in groups]
    rows = outs[0] if len(outs) == 1 else torch.cat(outs)
    if out_index is not None:
        rows = rows.index_select(0, out_index)
    return rows.view(tokens, heads, d)


def _attend(q_flat, k_flat, v_flat, g: TileGroup, d: int) -> torch.Tensor:
    """The group in slices of whole query tiles, at most ``SLICE_SLOTS`` (tile, key tile) slots each: an 8k-token
    prefill holds one slice's scores, not the whole matrix (a slice's rows get the bits they get in one call: each
    pair's matmuls are their own, a row's max and its key-ordered sum never cross a query tile)."""
    step = max(1, SLICE_SLOTS // g.max_key_tiles)
    if g.tiles <= step:
        return _attend_slice(q_flat, k_flat, v_flat, g, d)
    starts = torch.searchsorted(g.pair_tile, torch.arange(0, g.tiles + step, step, device=g.pair_tile.device))
    outs = []
    for t0, (p0, p1) in zip(range(0, g.tiles, step), zip(starts[:-1].tolist(), starts[1:].tolist())):
        t1 = min(g.tiles, t0 + step)
        part = TileGroup(g.rows, t1 - t0, g.max_key_tiles, g.pair_rows[p0:p1], g.pair_chunks[p0:p1],
                         g.pair_tile[p0:p1] - t0, g.pair_tile_rows[p0:p1] - t0,
                         g.pair_slot[p0:p1] - t0 * g.max_key_tiles, g.masked[p0:p1])
        outs.append(_attend_slice(q_flat, k_flat, v_flat, part, d))
    return torch.cat(outs)


def _attend_slice(q_flat, k_flat, v_flat, g: TileGroup, d: int) -> torch.Tensor:
    pairs = g.pair_tile.shape[0]
    qp = q_flat.index_select(0, g.pair_rows.view(-1)).view(pairs, g.rows, d)
    kp = k_flat.index_select(0, g.pair_chunks.view(-1)).view(pairs, KEY_TILE, d)
    vp = v_flat.index_select(0, g.pair_chunks.view(-1)).view(pairs, KEY_TILE, d)
    # Scores in float32 (bfloat16's 8 bits would blur exp(s - max) where scores are large); keys are
    # converted on the fly, so the cache stays in its dtype.
    s = torch.bmm(qp, kp.float().transpose(1, 2)).masked_fill_(g.masked, float("-inf"))
    row_max = torch.full((g.tiles, g.rows), float("-inf"), device=s.device)
    row_max.scatter_reduce_(0, g.pair_tile_rows, s.amax(-1), "amax")
    p = (s - row_max.index_select(0, g.pair_tile)[:, :, None]).mul_(d ** -0.5).exp_()
    # P·V per pair, and each pair's softmax denominator beside it: one scatter and one scan for both.
    partial = torch.cat([torch.bmm(p.to(vp.dtype), vp).float(), p.sum(-1, keepdim=True)], -1)
    by_key = torch.zeros(g.tiles * g.max_key_tiles, g.rows, d + 1, device=s.device)
    by_key.index_copy_(0, g.pair_slot, partial)
    total = by_key.view(g.tiles, g.max_key_tiles, g.rows, d + 1).cumsum(1)[:, -1]
    return (total[..., :d] / total[..., d:]).to(v_flat.dtype).view(-1, d)

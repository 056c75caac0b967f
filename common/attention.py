"""Batch-invariant causal attention: a compiled kernel on CPU, a fixed number of tensor operations elsewhere.

On CPU, where the machine's C++ compiler builds it, attention is one call of a small kernel
(``common/native/attention.cpp``): one task per query token and KV head reads that token's
keys in place through the chunk table and runs every reduction in one fixed order, so no
task's result depends on any other. It replaced about 25 tensor operations per layer whose
dispatch dominated small steps (measured in ``stages/03_paged_kv/README.md``). Everywhere
else (CUDA, or no compiler, or ``STEPWISE_NATIVE_ATTENTION=0``) the tensor-op version below
runs. The two are each batch-invariant and each close to plain attention, but they round
differently, so one process uses one of them for the reference and every stage alike.

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
it (``decode_tile_rows``), never assumed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from common import invariant, native

KEY_TILE = 64  # keys per tile: the fixed reduction length of both matmuls
QUERY_TOKENS = 64  # tokens per query tile of a prefilling sequence
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


@dataclass
class AttentionMetadata:
    """Where each query row of a step goes and where its keys live: built once per step, used by every layer.

    The flattened step holds, for sequence ``s``, ``query_lens[s]`` new tokens at positions
    ``context_lens[s] - query_lens[s] ...``. K/V storage is read in *chunks* of ``chunk_len``
    contiguous positions of one KV head: ``chunk_table[s, c]`` is the chunk holding positions
    ``c * chunk_len ...`` of sequence ``s`` for KV head 0, and head ``h`` adds ``h * head_stride``.
    A contiguous cache and a paged one differ only in that table.
    """
    query_lens: list[int]
    context_lens: list[int]
    groups: list[TileGroup]
    out_index: torch.Tensor | None  # [tokens * heads]: each q row's place in the groups' output rows (None: in place)
    plain: "PaddedBatch | None" = None  # set instead of the tiles for plain (not batch-invariant) math
    native: "NativeTable | None" = None  # set instead of the tiles where the compiled CPU kernel runs

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], num_heads: int, num_kv_heads: int,
              chunk_table: np.ndarray, chunk_len: int, head_stride: int,
              device: torch.device | str = "cpu", batch_invariant: bool = True,
              native: bool | None = None, *, head_dim: int, kv_dtype: torch.dtype) -> "AttentionMetadata":
        """native: the compiled CPU kernel (None: wherever it runs, see ``common.native``), or the tensor-op tiles;
        head_dim and kv_dtype (the cache's) size the tensor-op tiles."""
        assert KEY_TILE % chunk_len == 0, "a key tile must be whole chunks"
        if not batch_invariant:
            return cls(list(query_lens), list(context_lens), [], None,
                       PaddedBatch.build(query_lens, context_lens, num_kv_heads, chunk_table, chunk_len, head_stride,
                                         device))
        if native is None:
            native = uses_native(torch.device(device))
        if native:
            return cls(list(query_lens), list(context_lens), [], None, native=NativeTable.build(
                query_lens, context_lens, num_kv_heads, chunk_table, head_stride, device))
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
        return cls(list(query_lens), list(context_lens), groups,
                   None if in_order else torch.from_numpy(out_index).to(device))


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


def attention(q: torch.Tensor, k_chunks: torch.Tensor, v_chunks: torch.Tensor,
              meta: AttentionMetadata) -> torch.Tensor:
    """Causal grouped-query attention for a flattened step.

    q: [tokens, heads, d]; k_chunks, v_chunks: the cache's storage viewed as [chunks, chunk_len, d]
    (what lies past a sequence's length is masked and never enters the result, but must be
    finite). Returns [tokens, heads, d] in q's dtype.
    """
    if meta.plain is not None:
        return meta.plain.attention(q, k_chunks, v_chunks)
    if meta.native is not None:
        return meta.native.attention(q, k_chunks, v_chunks)
    tokens, heads, d = q.shape
    q_flat = q.reshape(tokens * heads, d).float()  # scores are computed in float32
    k_flat, v_flat = k_chunks.reshape(-1, k_chunks.shape[1] * d), v_chunks.reshape(-1, v_chunks.shape[1] * d)
    outs = [_attend(q_flat, k_flat, v_flat, g, d) for g in meta.groups]
    rows = outs[0] if len(outs) == 1 else torch.cat(outs)
    if meta.out_index is not None:
        rows = rows.index_select(0, meta.out_index)
    return rows.view(tokens, heads, d)


def _attend(q_flat, k_flat, v_flat, g: TileGroup, d: int) -> torch.Tensor:
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


def describe_attention(device: torch.device, batch_invariant: bool = True) -> str:
    if not batch_invariant:
        return "attention: plain math, torch's fused attention on the padded batch (not batch-invariant)"
    if device.type != "cpu":
        return f"attention: tensor ops on {device.type}"
    return native.describe()


def uses_native(device: torch.device) -> bool:
    """Whether attention on ``device`` runs the compiled CPU kernel (``common.native``, built on first use)."""
    return native.enabled(device)


@dataclass
class NativeTable:
    """What the compiled kernel reads: each token's sequence and position, and the sequences' chunk tables."""
    token_seq: torch.Tensor  # [tokens]
    token_pos: torch.Tensor  # [tokens]: the token attends keys 0 .. pos of its sequence
    chunk_table: torch.Tensor  # [seqs, width]
    num_kv_heads: int
    head_stride: int
    kernel: Callable  # common/native's attention, looked up once a step rather than once a layer

    @classmethod
    def build(cls, query_lens, context_lens, num_kv_heads, chunk_table, head_stride, device) -> "NativeTable":
        n, ctx = np.asarray(query_lens), np.asarray(context_lens)
        seq = np.repeat(np.arange(n.size), n)
        pos = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(ctx - n, n)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)  # noqa: E731
        return cls(t(seq), t(pos), t(chunk_table), num_kv_heads, head_stride, native.kernels().attention)

    def attention(self, q: torch.Tensor, k_chunks: torch.Tensor, v_chunks: torch.Tensor) -> torch.Tensor:
        return self.kernel(q, k_chunks, v_chunks, self.token_seq, self.token_pos, self.chunk_table,
                           self.num_kv_heads, self.head_stride)


@dataclass
class PaddedBatch:
    """Plain math, for comparison (``batch_invariant=False``): every sequence padded to the step's longest
    query and context, and torch's fused attention on the whole batch. Its kernels choose their blocking by
    shape, so a sequence's bits depend on what it is batched with."""
    q_index: torch.Tensor  # [seqs * max_query]: the token row each padded query reads
    q_valid: torch.Tensor  # [seqs * max_query] bool
    k_chunks: torch.Tensor  # [seqs * kv_heads, key_len // chunk_len] chunks of each stream, in position order
    allowed: torch.Tensor  # [seqs, 1, max_query, key_len] bool: causal and inside the context
    max_query: int

    @classmethod
    def build(cls, query_lens, context_lens, kvh, chunk_table, chunk_len, head_stride, device) -> "PaddedBatch":
        n, ctx = np.asarray(query_lens), np.asarray(context_lens)
        max_q, width = int(n.max()), chunk_table.shape[1]
        first = np.concatenate([[0], np.cumsum(n)[:-1]])
        i = np.arange(max_q)
        q_valid = i[None, :] < n[:, None]
        q_index = np.where(q_valid, first[:, None] + i[None, :], 0)
        q_pos = np.where(q_valid, ctx[:, None] - n[:, None] + i[None, :], 0)  # padding rows see key 0 only
        key_pos = np.arange(width * chunk_len)
        allowed = (key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos[None, None, :] < ctx[:, None, None])
        streams = (chunk_table[:, None, :] + (np.arange(kvh) * head_stride)[None, :, None]).reshape(-1, width)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        return cls(t(q_index.reshape(-1)), t(q_valid.reshape(-1)), t(streams), t(allowed[:, None]), max_q)

    def attention(self, q: torch.Tensor, k_chunks: torch.Tensor, v_chunks: torch.Tensor) -> torch.Tensor:
        tokens, heads, d = q.shape
        seqs = self.allowed.shape[0]
        qp = q.index_select(0, self.q_index).view(seqs, self.max_query, heads, d).transpose(1, 2)
        keys = self.k_chunks.shape[1] * k_chunks.shape[1]  # chunks per sequence x tokens per chunk
        k = k_chunks.index_select(0, self.k_chunks.view(-1)).view(seqs, -1, keys, d)
        v = v_chunks.index_select(0, self.k_chunks.view(-1)).view(seqs, -1, keys, d)
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=self.allowed, enable_gqa=True)
        return out.transpose(1, 2).reshape(seqs * self.max_query, heads, d)[self.q_valid]

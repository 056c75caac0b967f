"""Causal grouped-query attention for a flattened step, in one of three implementations.

Every stage and the reference call ``attention(q, k_chunks, v_chunks, meta)``; which
implementation runs is decided once per step, when ``AttentionMetadata.build`` is called:

* on CPU, where the machine's C++ compiler builds it, one call of a small compiled kernel
  (``attention_native.py``, source in ``native/attention.cpp``): one task per query token and KV
  head reads that token's keys in place and runs every reduction in one fixed order, so no task's
  result depends on any other;
* everywhere else (CUDA, no compiler, or ``STEPWISE_NATIVE_ATTENTION=0``) a fixed number of tensor
  operations over key tiles cut at fixed boundaries (``attention_tiles.py``);
* with ``batch_invariant=False``, plain math for comparison: torch's fused attention on a padded
  batch (``attention_plain.py``), whose bits depend on what a sequence is batched with.

The first two are each batch-invariant and each close to plain attention, but they round
differently, so one process uses one of them for the reference and every stage alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.numerics import native
from common.numerics.attention_native import NativeTable
from common.numerics.attention_plain import PaddedBatch
from common.numerics.attention_tiles import KEY_TILE, TileGroup, attend_tiles, build_tile_groups


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
    plain: PaddedBatch | None = None  # set instead of the tiles for plain (not batch-invariant) math
    native: NativeTable | None = None  # set instead of the tiles where the compiled CPU kernel runs

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], num_heads: int, num_kv_heads: int,
              chunk_table: np.ndarray, chunk_len: int, head_stride: int,
              device: torch.device | str = "cpu", batch_invariant: bool = True,
              native: bool | None = None, *, head_dim: int, kv_dtype: torch.dtype) -> "AttentionMetadata":
        """native: the compiled CPU kernel (None: wherever it runs, see ``common.numerics.native``), or the
        tensor-op tiles; head_dim and kv_dtype (the cache's) size the tensor-op tiles."""
        assert KEY_TILE % chunk_len == 0, "a key tile must be whole chunks"
        lens = list(query_lens), list(context_lens)
        if not batch_invariant:
            return cls(*lens, [], None, PaddedBatch.build(query_lens, context_lens, num_kv_heads, chunk_table,
                                                          chunk_len, head_stride, device))
        if native is None:
            native = uses_native(torch.device(device))
        if native:
            return cls(*lens, [], None, native=NativeTable.build(query_lens, context_lens, num_kv_heads, chunk_table,
                                                                 head_stride, device))
        groups, out_index = build_tile_groups(query_lens, context_lens, num_heads, num_kv_heads, chunk_table,
                                              chunk_len, head_stride, device, head_dim, kv_dtype)
        return cls(*lens, groups, out_index)


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
    return attend_tiles(q, k_chunks, v_chunks, meta.groups, meta.out_index)


def describe_attention(device: torch.device, batch_invariant: bool = True) -> str:
    if not batch_invariant:
        return "attention: plain math, torch's fused attention on the padded batch (not batch-invariant)"
    if device.type != "cpu":
        return f"attention: tensor ops on {device.type}"
    return native.describe()


def uses_native(device: torch.device) -> bool:
    """Whether attention on ``device`` runs the compiled CPU kernel (``common.numerics.native``, built on first use)."""
    return native.enabled(device)

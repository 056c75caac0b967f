"""The paged KV cache: one pool of blocks per layer, read and written through block tables.

Storage per layer is ``[num_blocks, kv_heads, block_size, head_dim]``: one block of one KV
head is contiguous, so attention gathers whole chunks of keys, not single rows. Each step,
``prepare`` turns the block tables into index tensors shared by all layers: where each new
token's keys and values go (``kv_write_rows``), and which chunks hold each sequence's keys
(the attention metadata). The attention itself is the same batch-invariant code as every
other stage; only the addressing changed.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from common.numerics.attention import KEY_TILE, AttentionMetadata, attention
from common.config import ModelConfig
from common.kv_cache import zeroed
from common.sequence import Sequence


class PagedKVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, batch_invariant: bool = True):
        self.config, self.block_size, self.batch_invariant = config, block_size, batch_invariant
        shape = (config.num_hidden_layers, num_blocks, config.num_key_value_heads, block_size, config.head_dim)
        # Zeros, not empty: masked positions are still read, and must be finite.
        self.k, self.v = zeroed(shape, dtype, device), zeroed(shape, dtype, device)
        # Attention reads chunks of chunk_len positions: whole blocks when a block divides a key tile.
        self.chunk_len = math.gcd(block_size, KEY_TILE)
        # Each layer's storage as the attention reads it (chunks) and as the store writes it (rows of head_dim),
        # viewed once here rather than four times per layer per step (a few microseconds each, at one request too).
        d, g = config.head_dim, self.chunk_len
        self.layer_chunks = [(k.view(-1, g, d), v.view(-1, g, d)) for k, v in zip(self.k, self.v)]
        self.layer_rows = [(k.view(-1, d), v.view(-1, d)) for k, v in zip(self.k, self.v)]
        self.meta: AttentionMetadata | None = None

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.config.kv_bytes_per_token(self.k.element_size())

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block ``destination`` gets ``source``'s keys and values in every layer, pair by pair in
        the order the block manager recorded them: a sample forked from a block copied earlier in the same step
        copies the copy, and a block freed and handed out again is read before it is overwritten."""
        for src, dst in pairs:
            self.k[:, dst] = self.k[:, src]
            self.v[:, dst] = self.v[:, src]

    @property
    def bytes_per_token(self) -> int:
        return self.config.kv_bytes_per_token(self.k.element_size())

    def prepare_step(self, batch) -> None:
        """The step's addressing (a `ScheduledBatch`): copy-on-write copies first, then the block tables."""
        self.copy_blocks(batch.copies)  # before this step's writes
        self.prepare(batch.seqs, batch.lens, batch.tables)

    def prepare(self, seqs: list[Sequence], query_lens: list[int], tables: list[list[int]]) -> None:
        """Describe the next step: seq s writes query_lens[s] tokens after its cached ones, into the blocks of
        its block table ``tables[s]``."""
        self.kv_write_rows = self.write_rows(seqs, query_lens, tables)
        self.meta = self.attention_metadata(seqs, query_lens, tables)

    def write_rows(self, seqs: list[Sequence], query_lens: list[int], tables: list[list[int]]) -> torch.Tensor:
        """[tokens, kv_heads]: the row of the layer's storage (viewed [blocks * kv_heads * block_size, d])
        that each new token's key and value go to, per KV head."""
        bs, kvh = self.block_size, self.config.num_key_value_heads
        pos = np.concatenate([np.arange(s.num_cached_tokens, s.num_cached_tokens + n)
                              for s, n in zip(seqs, query_lens)])
        block = np.concatenate([np.asarray(t)[np.arange(s.num_cached_tokens, s.num_cached_tokens + n) // bs]
                                for s, n, t in zip(seqs, query_lens, tables)])
        rows = (block[:, None] * kvh + np.arange(kvh)) * bs + (pos % bs)[:, None]
        return torch.from_numpy(rows).to(self.k.device)

    def attention_metadata(self, seqs: list[Sequence], query_lens: list[int],
                           tables: list[list[int]]) -> AttentionMetadata:
        """The attention's view of ``seqs``: their query rows, and their keys read through their block tables."""
        c, bs, g = self.config, self.block_size, self.chunk_len
        context_lens = [s.num_cached_tokens + n for s, n in zip(seqs, query_lens)]
        # Chunk c of a sequence (positions c*g ...) lies in block table[c*g // bs], sub-chunk (c*g % bs) // g.
        width = -(-max(context_lens) // g)
        chunk_pos = np.arange(width) * g
        table = np.zeros((len(seqs), width), dtype=np.int64)
        for i in range(len(seqs)):
            blocks = np.asarray(tables[i], dtype=np.int64)
            n = min(width, -(-context_lens[i] // g))
            table[i, :n] = blocks[chunk_pos[:n] // bs] * c.num_key_value_heads * (bs // g) + (chunk_pos[:n] % bs) // g
        return AttentionMetadata.build(query_lens, context_lens, c.num_attention_heads, c.num_key_value_heads,
                                       table, g, bs // g, self.k.device, self.batch_invariant,
                                       head_dim=c.head_dim, kv_dtype=self.k.dtype)

    def chunks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values as [chunks, chunk_len, head_dim], the attention's view."""
        return self.layer_chunks[layer]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_rows, v_rows, write_rows = self.store_target(layer)
        k_rows.index_copy_(0, write_rows.view(-1), k.reshape(-1, k_rows.shape[1]))
        v_rows.index_copy_(0, write_rows.view(-1), v.reshape(-1, v_rows.shape[1]))
        return self.attend(layer, q)

    def store_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where this step's keys and values go: the layer's storage as rows of head_dim, and each new token's
        row per KV head ([tokens, kv_heads])."""
        return *self.layer_rows[layer], self.kv_write_rows

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of this step's queries over the keys already stored."""
        return attention(q, *self.chunks(layer), self.meta)

"""The paged KV cache: one pool of blocks per layer, read and written through block tables.

Storage per layer is ``[num_blocks, block_size, kv_heads, head_dim]`` (vLLM's layout).
Each step, ``prepare`` turns the block tables into two index tensors shared by all
layers: where each new token's key/value goes (``slot_mapping``), and where each
sequence's keys live, position by position (``key_index``). The attention itself is
the same batch-invariant code as every other stage; only the addressing changed.
"""
from __future__ import annotations

import torch

from common.config import ModelConfig
from common.invariant import AttentionMetadata, attention, key_tiles_len
from common.sequence import Sequence


class PagedKVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device):
        self.config, self.block_size = config, block_size
        shape = (config.num_hidden_layers, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        # Zeros, not empty: masked positions are still read, and must be finite.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.meta: AttentionMetadata | None = None

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.config.kv_bytes_per_token(self.k.element_size())

    def prepare(self, seqs: list[Sequence], query_lens: list[int]) -> None:
        """Describe the next step: seq s writes query_lens[s] tokens after its cached ones."""
        self.slot_mapping = self.write_slots(seqs, query_lens)
        self.meta = self.attention_metadata(seqs, query_lens)

    def write_slots(self, seqs: list[Sequence], query_lens: list[int]) -> torch.Tensor:
        """The pool token row each new token's key and value go to: its block, then its offset in it."""
        bs = self.block_size
        return torch.tensor([seq.block_table[p // bs] * bs + p % bs for seq, n in zip(seqs, query_lens)
                             for p in range(seq.num_cached_tokens, seq.num_cached_tokens + n)], device=self.k.device)

    def attention_metadata(self, seqs: list[Sequence], query_lens: list[int]) -> AttentionMetadata:
        """The attention's view of ``seqs``: their query rows, and their keys read through their block tables."""
        c, bs = self.config, self.block_size
        kvh = c.num_key_value_heads
        context_lens = [s.num_cached_tokens + n for s, n in zip(seqs, query_lens)]
        # Key position p of sequence s lives in token row table[s][p // bs] * bs + p % bs of the pool;
        # positions past a table's end point at row 0 (finite, masked).
        key_len = key_tiles_len(context_lens)
        tables = torch.zeros(len(seqs), -(-key_len // bs), dtype=torch.long)
        for i, seq in enumerate(seqs):
            table = seq.block_table[:tables.shape[1]]
            tables[i, :len(table)] = torch.tensor(table, dtype=torch.long)
        pos = torch.arange(key_len)
        token_rows = tables[:, pos // bs] * bs + pos % bs  # [seqs, key_len]
        key_index = (token_rows[:, None, :] * kvh + torch.arange(kvh)[None, :, None]).view(-1, key_len)
        return AttentionMetadata.build(query_lens, context_lens, c.num_attention_heads, kvh, key_index.to(self.k.device))

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kvh, d = self.config.num_key_value_heads, self.config.head_dim
        kc, vc = self.k[layer].view(-1, kvh, d), self.v[layer].view(-1, kvh, d)
        kc[self.slot_mapping] = k
        vc[self.slot_mapping] = v
        return attention(q, kc.view(-1, d), vc.view(-1, d), self.meta)

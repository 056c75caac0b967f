"""A contiguous KV cache: one row of ``max_len`` positions per slot.

The reference uses it with one slot; stage 01 with one slot per request of a
static batch; stage 02 with one slot per running request. Stage 03 replaces it
with paged blocks.
"""
from __future__ import annotations

import torch

from common.config import ModelConfig
from common.invariant import KEY_TILE, AttentionMetadata, attention, contiguous_key_index, key_tiles_len


class ContiguousKVCache:
    def __init__(self, config: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype,
                 device: torch.device):
        self.config = config
        self.max_len = max_len
        padded = -(-max_len // KEY_TILE) * KEY_TILE  # attention reads whole key tiles
        shape = (config.num_hidden_layers, num_slots, config.num_key_value_heads, padded, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.meta: AttentionMetadata | None = None

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    @property
    def reserved_bytes(self) -> int:
        """Bytes set aside for `max_len` tokens in every slot, used or not."""
        return self.num_slots * self.max_len * self.config.kv_bytes_per_token(self.k.element_size())

    def prepare(self, slots: list[int], query_lens: list[int], context_lens: list[int]) -> None:
        """Describe the next step: sequence s writes query_lens[s] tokens into row slots[s]."""
        c, dev = self.config, self.k.device
        key_index = contiguous_key_index(slots, c.num_key_value_heads, self.k.shape[3], key_tiles_len(context_lens), dev)
        self.meta = AttentionMetadata.build(query_lens, context_lens, c.num_attention_heads,
                                            c.num_key_value_heads, key_index)
        self.write_slot = torch.tensor([s for s, n in zip(slots, query_lens) for _ in range(n)], device=dev)
        self.write_pos = torch.tensor([p for n, ctx in zip(query_lens, context_lens)
                                       for p in range(ctx - n, ctx)], device=dev)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.k[layer], self.v[layer]
        kc[self.write_slot, :, self.write_pos] = k
        vc[self.write_slot, :, self.write_pos] = v
        d = self.config.head_dim
        return attention(q, kc.view(-1, d), vc.view(-1, d), self.meta)

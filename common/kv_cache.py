"""A contiguous KV cache: one row of ``max_len`` positions per slot.

The reference uses it with one slot; stage 01 with one slot per request of a
static batch; stage 02 with one slot per running request. Stage 03 replaces it
with paged blocks.
"""
from __future__ import annotations

import math
import mmap
import os

import numpy as np
import torch

from common.numerics import KEY_TILE, AttentionMetadata, attention
from common.config import ModelConfig


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of zeros whose pages cost nothing until written, on CPU: anonymous memory, which the kernel hands
    out zeroed on first touch (``torch.zeros`` writes every byte up front, so a KV budget was resident, and paid
    for in start-up time, before the first token). Reads of untouched pages see zeros. Elsewhere ``torch.zeros``."""
    count = math.prod(shape)
    if torch.device(device).type != "cpu" or count == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    buffer = mmap.mmap(-1, count * dtype.itemsize)  # the tensor keeps it alive
    if hasattr(mmap, "MADV_HUGEPAGE") and os.environ.get("STEPWISE_HUGE_PAGES", "1") != "0":
        try:  # 2 MiB pages: a first write into a block faults once per 2 MiB, not once per 4 KiB, mid-step
            buffer.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)


class ContiguousKVCache:
    def __init__(self, config: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype,
                 device: torch.device, batch_invariant: bool = True):
        self.config, self.batch_invariant = config, batch_invariant
        self.max_len = max_len
        padded = -(-max_len // KEY_TILE) * KEY_TILE  # attention reads whole key tiles
        shape = (config.num_hidden_layers, num_slots, config.num_key_value_heads, padded, config.head_dim)
        # Zeros, not empty: positions past a sequence's length are read (then masked), so they must be finite.
        self.k, self.v = zeroed(shape, dtype, device), zeroed(shape, dtype, device)
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
        # Attention reads a slot's row in chunks of one key tile: chunk (slot, head, t) = (slot * kvh + head) * T + t.
        tiles_per_row = self.k.shape[3] // KEY_TILE
        width = -(-max(context_lens) // KEY_TILE)
        table = (np.asarray(slots)[:, None] * c.num_key_value_heads * tiles_per_row + np.arange(width))
        self.meta = AttentionMetadata.build(query_lens, context_lens, c.num_attention_heads, c.num_key_value_heads,
                                            table, KEY_TILE, tiles_per_row, dev, self.batch_invariant,
                                            head_dim=c.head_dim, kv_dtype=self.k.dtype)
        self.write_slot = torch.tensor([s for s, n in zip(slots, query_lens) for _ in range(n)], device=dev)
        self.write_pos = torch.tensor([p for n, ctx in zip(query_lens, context_lens)
                                       for p in range(ctx - n, ctx)], device=dev)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.k[layer], self.v[layer]
        kc[self.write_slot, :, self.write_pos] = k
        vc[self.write_slot, :, self.write_pos] = v
        d = self.config.head_dim
        return attention(q, kc.view(-1, KEY_TILE, d), vc.view(-1, KEY_TILE, d), self.meta)

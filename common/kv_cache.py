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
from common.loader import parse_memory
from common.validate import InvalidParam


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


def slots_for_budget(config, model) -> int:
    """How many slots of ``max_model_len`` positions a KV budget buys (stages 01-02), at most ``max_num_seqs``; all
    ``max_num_seqs`` when no budget is set. ``config``: an `EngineConfig`."""
    budget = parse_memory(config.cache.kv_cache_memory, model.device)
    max_len, slots = config.model.max_model_len, config.scheduler.max_num_seqs
    if budget is None:
        return slots
    per_slot = max_len * model.config.kv_bytes_per_token(model.dtype.itemsize)
    if budget < per_slot:
        raise InvalidParam("kv_cache_memory", f"kv_cache_memory={config.cache.kv_cache_memory} holds no "
                           f"{max_len}-token slot ({per_slot:,} bytes): raise it or lower max_model_len")
    return min(slots, budget // per_slot)


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
    def bytes_per_token(self) -> int:
        return self.config.kv_bytes_per_token(self.k.element_size())

    @property
    def reserved_bytes(self) -> int:
        """Bytes set aside for `max_len` tokens in every slot, used or not."""
        return self.num_slots * self.max_len * self.bytes_per_token

    def prepare_step(self, batch) -> None:
        """The step's addressing (a `ScheduledBatch`): each sequence writes its tokens into its slot's row, after
        the ones cached there, and attends to all of them (its draft tokens included)."""
        self.prepare(batch.slots, batch.lens, [len(s) + len(s.spec_token_ids) for s in batch.seqs])

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

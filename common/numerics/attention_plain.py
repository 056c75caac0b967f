"""Plain attention, for comparison: torch's fused kernel on a padded batch (not batch-invariant)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


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

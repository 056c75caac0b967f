"""What the compiled CPU attention kernel (``common/numerics/native/attention.cpp``) reads, built once a step."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from common.numerics import native


@dataclass
class NativeTable:
    """What the compiled kernel reads: each token's sequence and position, and the sequences' chunk tables."""
    token_seq: torch.Tensor  # [tokens]
    token_pos: torch.Tensor  # [tokens]: the token attends keys 0 .. pos of its sequence
    chunk_table: torch.Tensor  # [seqs, width]
    num_kv_heads: int
    head_stride: int
    kernel: Callable  # common/numerics/native's attention, looked up once a step rather than once a layer

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


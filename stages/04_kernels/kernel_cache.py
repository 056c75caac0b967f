"""Stage 03's paged cache, with the KV write (and, opted into, the decode attention) as Triton kernels on CUDA.

The KV write is a copy: its kernel changes no bit. The paged decode-attention kernel (flash-decoding, fixed split
size, `paged_attention.py`) is batch-invariant too, but its reductions are not the reference's (cuBLAS): a token's KV
would depend on whether a decode step or a prefill chunk computed it, and tokens would stop matching. So it runs only
when asked for (``LLM(..., fused_attention=True)``), for the decoding sequences: faster, at the guarantee's price.
"""
from __future__ import annotations

import torch

from common.numerics.attention import attention
from common.sequence import Sequence
from stages.paged_kv import PagedKVCache  # stage 03: paged_cache.py

from .model import kernels_available


class KernelPagedCache(PagedKVCache):
    """Stage 03's `PagedKVCache` (stages/03_paged_kv/paged_cache.py) with the KV write as a Triton kernel."""

    def __init__(self, *args, fused_attention: bool = False, **kwargs):
        """fused_attention: decoding sequences attend in the Triton kernel, when the kernels run."""
        super().__init__(*args, **kwargs)
        self.use_kernels, _ = kernels_available(self.k.device)
        self.fused_attention = fused_attention and self.use_kernels
        if self.use_kernels:
            from . import elementwise, paged_attention
            self.elementwise, self.paged_attention = elementwise, paged_attention

    def prepare(self, seqs: list[Sequence], query_lens: list[int], tables: list[list[int]]) -> None:
        if not self.fused_attention:
            return super().prepare(seqs, query_lens, tables)
        dev = self.k.device
        self.kv_write_rows = self.write_rows(seqs, query_lens, tables)
        starts = torch.tensor([0] + query_lens).cumsum(0).tolist()
        decode = [i for i, n in enumerate(query_lens) if n == 1]
        prefill = [i for i, n in enumerate(query_lens) if n > 1]
        self.decode_rows = torch.tensor([starts[i] for i in decode], dtype=torch.long, device=dev)
        self.prefill_rows = torch.tensor([r for i in prefill for r in range(starts[i], starts[i + 1])],
                                         dtype=torch.long, device=dev)
        ctx = [seqs[i].num_cached_tokens + 1 for i in decode]
        self.decode_max_ctx = max(ctx, default=0)
        width = max((len(tables[i]) for i in decode), default=1)
        decode_tables = torch.zeros(len(decode), width, dtype=torch.int32)
        for row, i in enumerate(decode):
            decode_tables[row, :len(tables[i])] = torch.tensor(tables[i], dtype=torch.int32)
        self.decode_tables, self.decode_ctx = decode_tables.to(dev), torch.tensor(ctx, dtype=torch.int32, device=dev)
        # Stage 03's attention, for the prefilling sequences alone.
        self.meta = (self.attention_metadata([seqs[i] for i in prefill], [query_lens[i] for i in prefill],
                                             [tables[i] for i in prefill]) if prefill else None)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not self.use_kernels:
            return super().__call__(layer, q, k, v)
        kc, vc = self.k[layer], self.v[layer]
        self.elementwise.store_kv(k, v, kc, vc, self.kv_write_rows)
        if not self.fused_attention:
            return attention(q, *self.chunks(layer), self.meta)
        out = torch.empty_like(q)
        if self.decode_rows.numel():
            out[self.decode_rows] = self.paged_attention.paged_decode_attention(
                q[self.decode_rows], kc, vc, self.decode_tables, self.decode_ctx, self.decode_max_ctx)
        if self.meta is not None:
            out[self.prefill_rows] = attention(q[self.prefill_rows], *self.chunks(layer), self.meta)
        return out

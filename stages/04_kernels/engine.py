"""Stage 04: stage 03's engine with its hot operations as fused Triton kernels.

Nothing about scheduling, paging or caching changes: the model's element-wise
operations (`KernelLlama`) run as fused kernels (Triton on CUDA, AOTInductor on CPU), and
the KV cache's write and decode attention (`KernelPagedCache`) as Triton kernels on CUDA.
"""
from __future__ import annotations

import importlib

from .kernel_cache import KernelPagedCache
from .model import KernelLlama

paged = importlib.import_module("stages.03_paged_kv")


class LLM(paged.LLM):
    model_class = KernelLlama
    cache_class = KernelPagedCache

    def __init__(self, model: str = "smollm2-135m", *, fused_attention: bool = False, **kwargs):
        """fused_attention: decode attention in the Triton kernel on CUDA (faster, not the reference's bits)."""
        super().__init__(model, **kwargs)
        self.cache.fused_attention = bool(fused_attention) and self.cache.use_kernels

    @property
    def execution_path(self) -> str:
        return self.model.path

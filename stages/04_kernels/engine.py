"""Stage 04: stage 03's engine with its hot operations as fused kernels.

Nothing about scheduling, paging or caching changes: the engine is stage 03's with two parts
swapped. The model's element-wise operations (`KernelLlama`) run as fused kernels (Triton on
CUDA, hand-written C++ on CPU), and the KV cache's write (`KernelPagedCache`) as a
Triton kernel on CUDA, where the paged decode-attention kernel is an opt-in.
"""
from __future__ import annotations

from common.llm import LLM as FrontEnd
from common.validate import check_bool
from stages import paged_kv as paged

from .kernel_cache import KernelPagedCache
from .model import KernelLlama


class LLMEngine(paged.LLMEngine):
    model_class, cache_class = KernelLlama, KernelPagedCache

    def __init__(self, model: KernelLlama, *, fused_attention: bool = False, **options):
        """fused_attention: decode attention in the Triton kernel on CUDA (faster, not the reference's bits)."""
        check_bool("fused_attention", fused_attention)
        super().__init__(model, **options)
        self.cache.fused_attention = fused_attention and self.cache.use_kernels


class LLM(FrontEnd):
    engine_class = LLMEngine

    @property
    def execution_path(self) -> str:
        return self.model.path

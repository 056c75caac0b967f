"""Stage 04: stage 03's engine with its hot operations as fused kernels.

Nothing about scheduling, paging or caching changes: the engine is stage 03's parts with two
swapped. The model's element-wise operations (`KernelLlama`) run as fused kernels (Triton on
CUDA, hand-written C++ on CPU), and the KV cache's write (`KernelPagedCache`) as a
Triton kernel on CUDA, where the paged decode-attention kernel is an opt-in
(``LLM(..., fused_attention=True)``: faster, not the reference's bits).
"""
from __future__ import annotations

from common.engine import LLMEngine
from common.engine_config import EngineConfig
from common.llm import LLM as FrontEnd
from common.runner import ModelRunner
from stages.paged_kv import Scheduler, kv_blocks  # stage 03: scheduler.py, kv_budget.py

from .kernel_cache import KernelPagedCache
from .model import KernelLlama


def build(config: EngineConfig, tokenizer=None) -> LLMEngine:
    """Stage 03's engine (its scheduler and block pool) with this stage's model and cache."""
    model = config.model.load(KernelLlama)  # model.py: fused element-wise kernels
    blocks = kv_blocks(config, model)  # stage 03: the block pool and its prefix cache
    cache = KernelPagedCache(model.config, blocks.num_blocks, blocks.block_size, model.dtype, model.device,
                             model.batch_invariant, fused_attention=config.cache.fused_attention)  # kernel_cache.py
    return LLMEngine(model, Scheduler(config.scheduler, blocks), cache, ModelRunner(model))  # stage 03's scheduler


class LLM(FrontEnd):
    build = staticmethod(build)

    @property
    def execution_path(self) -> str:
        return self.model.path

"""Stage 03: paged KV cache. Memory is held per block as tokens arrive, not per slot up front.

What changes from stage 02: the KV pool is a fixed number of blocks sized from a memory
budget; a `BlockManager` hands them out (paging); the `Scheduler` admits requests while
blocks allow, under a per-step token budget that splits long prompts (chunked prefill),
preempts when blocks run out (preemption) and shares cached prompt blocks (prefix caching);
the `PagedKVCache` reads and writes keys and values through the block tables; the budget becomes
blocks in kv_budget.py. The engine loop is the shared one (common/engine.py): schedule -> run -> postprocess.
"""
from __future__ import annotations

from common.engine import LLMEngine
from common.engine_config import EngineConfig
from common.llm import LLM as FrontEnd
from common.model import Llama
from common.runner import ModelRunner

from .kv_budget import kv_blocks
from .paged_cache import PagedKVCache
from .scheduler import Scheduler


def build(config: EngineConfig, tokenizer=None) -> LLMEngine:
    """Stage 03's engine: the shared loop and runner over this stage's scheduler, block pool and paged cache."""
    model = config.model.load(Llama)  # common/model.py
    blocks = kv_blocks(config, model)  # kv_budget.py: block_manager.py's pool, prefix_cache.py
    cache = PagedKVCache(model.config, blocks.num_blocks, blocks.block_size, model.dtype, model.device,
                         model.batch_invariant)  # paged_cache.py
    return LLMEngine(model, Scheduler(config.scheduler, blocks), cache, ModelRunner(model))  # scheduler.py


class BlockAudit:
    """An observer that checks the block accounting after every step (`BlockManager.audit`): the tests and the
    labs attach it with ``llm.add_observer(BlockAudit(llm.engine))``."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine

    def on_step(self, event) -> None:
        self.engine.scheduler.block_manager.audit(self.engine.scheduler.running)


class LLM(FrontEnd):
    build = staticmethod(build)

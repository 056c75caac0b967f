"""Stage 03: paged KV cache: paging (block_manager), prefix caching (prefix_cache), preemption (preemption)
and chunked prefill (scheduler), assembled by the engine."""
from .block_manager import BlockManager
from .engine import LLM, BlockAudit, LLMEngine
from .paged_cache import PagedKVCache
from .prefix_cache import PrefixCache
from .scheduler import Scheduler

__all__ = ["LLM", "LLMEngine", "BlockAudit", "Scheduler", "BlockManager", "PrefixCache", "PagedKVCache"]

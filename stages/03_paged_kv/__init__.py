"""Stage 03: paged KV cache with a block manager, preemption, prefix caching and chunked prefill."""
from .block_manager import BlockManager
from .engine import LLM, parse_memory
from .paged_cache import PagedKVCache
from .scheduler import Scheduler

__all__ = ["LLM", "Scheduler", "BlockManager", "PagedKVCache", "parse_memory"]

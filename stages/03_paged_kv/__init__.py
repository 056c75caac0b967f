"""Stage 03: paged KV cache with a block manager, preemption, prefix caching and chunked prefill."""
from .block_manager import BlockManager
from common.loader import parse_memory

from .engine import LLM
from .paged_cache import PagedKVCache
from .scheduler import Scheduler

__all__ = ["LLM", "Scheduler", "BlockManager", "PagedKVCache", "parse_memory"]

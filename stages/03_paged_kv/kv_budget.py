"""The KV budget in blocks: how many blocks of ``block_size`` tokens the pool has, checked before it is made.

Stage 03's pool is a fixed number of blocks, bought once with a memory budget (``kv_cache_memory``: bytes,
``"48MiB"``, or a fraction of the memory free after the weights). Told nothing, it reserves what stage 02 would for
max_num_seqs slots of max_model_len, never more than 90% of what the machine has left; a budget larger than that
is refused with what to set, and one that buys no block with the size of a block.
"""
from __future__ import annotations

from common.engine_config import EngineConfig
from common.loader import parse_memory
from common.model import Llama
from common.validate import InvalidParam

from .block_manager import BlockManager
from .prefix_cache import PrefixCache


def kv_blocks(config: EngineConfig, model: Llama) -> BlockManager:
    """The pool the KV budget buys, in blocks of ``block_size`` tokens (by default what stage 02 reserves for
    max_num_seqs slots of max_model_len, each rounded up to whole blocks: a request of max_model_len tokens always
    fits), with a prefix cache unless it is switched off."""
    c, bs = config.cache, config.cache.block_size
    per_block = bs * model.config.kv_bytes_per_token(model.dtype.itemsize)
    budget = parse_memory(c.kv_cache_memory, model.device)  # a fraction of free memory is measured now
    available = available_memory(model.device)
    if budget is None:  # stage 02's reservation, but never more than 90% of what the machine has left
        budget = config.scheduler.max_num_seqs * -(-config.model.max_model_len // bs) * per_block
        budget = min(budget, int(0.9 * available)) if available else budget
    elif available and budget > available:
        raise MemoryError(f"kv_cache_memory={c.kv_cache_memory} asks for {budget / 2**30:.2f} GiB of KV blocks but "
                          f"only {available / 2**30:.2f} GiB is available after the weights: set kv_cache_memory "
                          f"below that (e.g. kv_cache_memory=0.9, a fraction of what is free), or lower "
                          f"max_num_seqs or max_model_len")
    if budget < per_block:
        raise InvalidParam("kv_cache_memory", f"a KV budget of {budget:,} bytes holds no block: one block of "
                           f"{bs} tokens needs {per_block:,} bytes; raise kv_cache_memory to at least that")
    return BlockManager(budget // per_block, bs, PrefixCache(bs) if c.enable_prefix_caching else None)


def available_memory(device) -> int | None:
    """Bytes free for the KV pool: the device's free memory on CUDA, the RAM available on CPU (None: unknown)."""
    import os

    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # MemAvailable counts the page cache the kernel would give back (a checkpoint just read, say)
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

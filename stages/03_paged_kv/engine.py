"""Stage 03: paged KV cache. Memory is held per block as tokens arrive, not per slot up front.

What changes from stage 02: the KV pool is a fixed number of blocks sized from a memory
budget; a `BlockManager` hands them out (paging); the `Scheduler` admits requests while
blocks allow, under a per-step token budget that splits long prompts (chunked prefill),
preempts when blocks run out (preemption) and shares cached prompt blocks (prefix caching);
the `PagedKVCache` reads and writes keys and values through the block tables. The engine
loop is the shared one (common/engine.py): schedule -> run -> postprocess.
"""
from __future__ import annotations

from common.engine import LLMEngine
from common.engine_config import EngineConfig
from common.llm import LLM as FrontEnd
from common.loader import parse_memory
from common.model import Llama
from common.runner import ModelRunner
from common.validate import InvalidParam

from .block_manager import BlockManager
from .paged_cache import PagedKVCache
from .prefix_cache import PrefixCache
from .scheduler import Scheduler


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


def build(config: EngineConfig, tokenizer=None) -> LLMEngine:
    """Stage 03's engine: the shared loop and runner over this stage's scheduler, block pool and paged cache."""
    model = config.model.load(Llama)  # common/model.py
    blocks = kv_blocks(config, model)  # block_manager.py, prefix_cache.py
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

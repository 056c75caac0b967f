"""Stage 03: paged KV cache. Memory is held per block as tokens arrive, not per slot up front.

What changes from stage 02: the KV pool is a fixed number of blocks sized from a memory
budget; a `BlockManager` hands them out (paging); the `Scheduler` admits requests while
blocks allow, under a per-step token budget that splits long prompts (chunked prefill),
preempts when blocks run out (preemption) and shares cached prompt blocks (prefix caching).
The engine loop still reads schedule -> run -> postprocess.
"""
from __future__ import annotations

from common.engine import BlockState, EngineState, StepResult
from common.llm import LLM as FrontEnd
from common.model import Llama
from common.runner import ModelRunner
from common.sequence import Sequence
from common.loader import parse_memory
from common.validate import InvalidParam, check_bool, check_int, clip

from .block_manager import BlockManager
from .paged_cache import PagedKVCache
from .prefix_cache import PrefixCache
from .scheduler import Scheduler


class LLMEngine:
    model_class, cache_class, scheduler_class = Llama, PagedKVCache, Scheduler  # stages 04-05 swap parts
    paged = True  # takes a KV memory budget in blocks (the command lines' --kv-memory)

    def __init__(self, model: Llama, *, max_model_len: int, max_num_seqs: int, block_size: int = 16,
                 kv_cache_memory: str | int | float | None = None, kv_cache_memory_bytes: int | None = None,
                 max_num_batched_tokens: int = 512,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                 enable_preemption: bool = True):
        check_int("block_size", block_size, 1)  # 16 is the usual choice
        check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        for name, flag in (("enable_prefix_caching", enable_prefix_caching),
                           ("enable_chunked_prefill", enable_chunked_prefill),
                           ("enable_preemption", enable_preemption)):
            check_bool(name, flag)
        if max_num_batched_tokens < max_num_seqs:
            raise InvalidParam("max_num_batched_tokens", f"max_num_batched_tokens={max_num_batched_tokens} must be "
                               f">= max_num_seqs={max_num_seqs}, or some running requests could never decode")
        c = model.config
        per_block = block_size * c.kv_bytes_per_token(model.dtype.itemsize)
        if kv_cache_memory_bytes is not None:  # vLLM's name: a plain byte count
            if kv_cache_memory is not None:
                raise InvalidParam("kv_cache_memory_bytes", "give kv_cache_memory_bytes or kv_cache_memory, not both")
            check_int("kv_cache_memory_bytes", kv_cache_memory_bytes, 1)
            kv_cache_memory = kv_cache_memory_bytes
        try:  # bytes, "48MiB", "2GB", or a fraction of free memory like 0.5
            budget = parse_memory(kv_cache_memory, model.device)
        except (ValueError, TypeError) as e:
            raise InvalidParam("kv_cache_memory", f"kv_cache_memory={clip(kv_cache_memory)} is invalid: {e}") from None
        if budget is None:  # default: what stage 02 reserves for max_num_seqs slots of max_model_len
            budget = max_num_seqs * max_model_len * per_block // block_size
        check_int("kv_cache_memory", budget, 1)
        if budget < per_block:
            raise InvalidParam("kv_cache_memory", f"a KV budget of {budget:,} bytes holds no block: one block of "
                               f"{block_size} tokens needs {per_block:,} bytes; raise kv_cache_memory to at least that")
        self.model, self.max_model_len, self.block_size = model, max_model_len, block_size
        self.kv_cache_memory_bytes, self.max_num_batched_tokens = budget, max_num_batched_tokens
        self.chunked_prefill = enable_chunked_prefill
        self.prefix_cache = PrefixCache(block_size) if enable_prefix_caching else None
        self.block_manager = BlockManager(budget // per_block, block_size, self.prefix_cache)
        self.scheduler = self.scheduler_class(self.block_manager, max_num_seqs, max_num_batched_tokens,
                                              self.prefix_cache, enable_chunked_prefill, enable_preemption,
                                              max_model_len)
        self.cache = self.cache_class(c, self.block_manager.num_blocks, block_size, model.dtype, model.device,
                                      model.batch_invariant)
        self.runner = ModelRunner(model)
        self.num_in_step = 0

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_manager.num_blocks * self.block_size

    def check(self, seq: Sequence) -> None:
        """A request the pool can never hold fails at submission, with what to change."""
        cap, n = self.kv_capacity_tokens, seq.num_prompt_tokens
        if n > cap:
            raise InvalidParam("prompt", f"the prompt has {n} tokens but the whole KV pool holds {cap} "
                               f"({self.block_manager.num_blocks} blocks of {self.block_size}): shorten the prompt or "
                               f"raise kv_cache_memory")
        need = min(n + seq.params.max_tokens, self.max_model_len)
        if need > cap:
            raise InvalidParam("max_tokens", f"the prompt ({n} tokens) plus max_tokens ({seq.params.max_tokens}) can "
                               f"need {need} tokens of KV but the whole pool holds {cap}: lower max_tokens to at most "
                               f"{cap - n} or raise kv_cache_memory")
        if not self.chunked_prefill and n > self.max_num_batched_tokens:
            raise InvalidParam("prompt", f"the prompt has {n} tokens but without chunked prefill a step holds at most "
                               f"max_num_batched_tokens={self.max_num_batched_tokens}: raise it or enable chunked "
                               f"prefill")

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> StepResult:
        pc = self.prefix_cache
        queried = pc.queried_tokens if pc else 0
        seqs, lens = self.scheduler.schedule()
        if not seqs:
            raise RuntimeError("the scheduler could not run anything: a request larger than the pool?")
        self.num_in_step = len(self.scheduler.running)  # in flight this step, the ones it finishes included
        starts = [s.num_cached_tokens for s in seqs]
        copies = self.block_manager.take_copies()
        self.cache.copy_blocks(copies)  # copy-on-write, before this step's writes
        self.cache.prepare(seqs, lens, [self.block_manager.table(s) for s in seqs])
        outputs = self.runner.run(seqs, lens, self.cache)
        self.scheduler.postprocess(seqs, lens, outputs)
        admitted = self.scheduler.admitted
        return StepResult(seqs, lens, starts, outputs, admitted=[s.seq_id for s in admitted],
                          preempted=[s.seq_id for s in self.scheduler.preempted],
                          prefix_hits=dict(self.scheduler.prefix_hits),
                          prefix_query_tokens=pc.queried_tokens - queried if pc else 0, copies=copies)

    def release(self) -> None:
        self.scheduler.release_all()

    # ---- the state the observers read after each step ---------------------------------------
    def state(self) -> EngineState:
        bm, pc = self.block_manager, self.prefix_cache
        cached = [b for b in pc.of_block if bm.blocks[b].ref_count == 0] if pc else []
        blocks = BlockState(bm.num_blocks, bm.block_size, bm.num_free_blocks,
                            {seq_id: list(t) for seq_id, t in bm.tables.items()}, cached)
        return EngineState(self.num_slots, self.num_in_step, len(self.scheduler.running), len(self.scheduler.waiting),
                           self.kv_bytes_reserved(), self.kv_bytes_used(), blocks)

    @property
    def num_slots(self) -> int:
        return self.scheduler.max_num_seqs

    def kv_bytes_reserved(self) -> int:
        return self.block_manager.num_used_blocks * self.block_size * self._per_token

    def kv_bytes_used(self) -> int:
        return self.scheduler.held_tokens * self._per_token

    @property
    def _per_token(self) -> int:
        return self.model.config.kv_bytes_per_token(self.model.dtype.itemsize)


class BlockAudit:
    """An observer that checks the block accounting after every step (`BlockManager.audit`): the tests and the
    labs attach it with ``llm.add_observer(BlockAudit(llm.engine))``."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine

    def on_step(self, event) -> None:
        self.engine.block_manager.audit(self.engine.scheduler.running)


class LLM(FrontEnd):
    engine_class = LLMEngine

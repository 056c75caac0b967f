"""Stage 03: paged KV cache. Memory is held per block as tokens arrive, not per slot up front.

What changes from stage 02: the KV pool is a fixed number of blocks sized from a
memory budget; a `BlockManager` hands them out; the `Scheduler` admits requests
while blocks allow (not while slots allow), preempts when they run out, shares
cached prefix blocks, and splits long prompts into chunks under a per-step token
budget. The engine loop still reads schedule -> run -> postprocess.
"""
from __future__ import annotations

import importlib

from common.loader import parse_memory
from common.runner import ModelRunner
from common.sequence import Sequence
from common.validate import InvalidParam, check_bool, check_int, clip

from .block_manager import BlockManager
from .paged_cache import PagedKVCache
from .scheduler import Scheduler

continuous = importlib.import_module("stages.02_continuous_batch")

class LLM(continuous.LLM):
    cache_class = PagedKVCache  # stage 04 swaps in one that runs Triton kernels on CUDA

    def __init__(self, model: str = "smollm2-135m", *, block_size: int = 16,
                 kv_cache_memory: str | int | float | None = None, max_num_batched_tokens: int = 512,
                 enable_prefix_caching: bool = True, **kwargs):
        check_int("block_size", block_size, 1)  # 16 is the usual choice
        check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        check_bool("enable_prefix_caching", enable_prefix_caching)
        super().__init__(model, **kwargs)
        if max_num_batched_tokens < self.max_num_seqs:
            raise InvalidParam("max_num_batched_tokens", f"max_num_batched_tokens={max_num_batched_tokens} must be "
                               f">= max_num_seqs={self.max_num_seqs}, or some running requests could never decode")
        per_block = block_size * self.config.kv_bytes_per_token(self.dtype.itemsize)
        # Default budget: what stage 02 reserves for max_num_seqs slots of max_model_len tokens.
        try:
            budget = parse_memory(kv_cache_memory, self.device)
        except ValueError as e:
            raise InvalidParam("kv_cache_memory", f"kv_cache_memory={clip(kv_cache_memory)} is invalid: {e}") from None
        if budget is None:
            budget = self.max_num_seqs * self.max_model_len * per_block // block_size
        if budget < per_block:
            raise InvalidParam("kv_cache_memory", f"KV memory budget of {budget:,} bytes holds no block: one block "
                               f"of {block_size} tokens needs {per_block:,} bytes; raise kv_cache_memory to at least "
                               f"that")
        self.block_size, self.max_num_batched_tokens = block_size, max_num_batched_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.kv_budget_bytes = budget
        self.block_manager = BlockManager(budget // per_block, block_size)
        self.cache = self.cache_class(self.config, self.block_manager.num_blocks, block_size, self.dtype, self.device,
                                      self.batch_invariant)
        self.runner = ModelRunner(self.model)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_manager.num_blocks * self.block_size

    def make_sequence(self, prompt, params) -> Sequence:
        seq = super().make_sequence(prompt, params)
        cap = self.kv_capacity_tokens
        if seq.num_prompt_tokens > cap:
            raise InvalidParam("prompt", f"the prompt has {seq.num_prompt_tokens} tokens but the whole KV pool holds "
                               f"{cap} ({self.block_manager.num_blocks} blocks of {self.block_size}): shorten the "
                               f"prompt or raise kv_cache_memory")
        need = min(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len)
        if need > cap:
            raise InvalidParam("max_tokens", f"the prompt ({seq.num_prompt_tokens} tokens) plus max_tokens "
                               f"({seq.params.max_tokens}) can need {need} tokens of KV but the whole pool holds "
                               f"{cap}: lower max_tokens to at most {cap - seq.num_prompt_tokens} or raise "
                               f"kv_cache_memory")
        return seq

    def _run(self, seqs: list[Sequence]) -> None:
        self.scheduler = Scheduler(self.block_manager, self.max_num_seqs, self.max_num_batched_tokens,
                                   self.enable_prefix_caching)
        for seq in seqs:
            self.scheduler.add(seq)
        self.block_timeline: list[int] = []  # blocks in use after each step
        try:
            while self.scheduler.has_work():
                if not self.step():
                    raise RuntimeError("the scheduler could not run anything: a request larger than the pool?")
        finally:  # an exception must not leak blocks into the next call
            self.scheduler.release_all()

    def step(self) -> list[Sequence]:
        """One engine iteration: schedule -> run -> postprocess. Returns the sequences that ran."""
        scheduler, bm = self.scheduler, self.block_manager
        preempted, hits, queried = scheduler.num_preemptions, bm.hit_tokens, bm.queried_tokens
        batch, lens = scheduler.schedule()
        if not batch:
            return []
        starts = [s.num_cached_tokens for s in batch]
        self.cache.prepare(batch, lens)
        tokens = self.runner.run(batch, lens, self.cache)
        for seq, token in zip(batch, tokens):
            if token is not None:
                seq.append_token(token)
        st = self.stats
        st.preemptions += scheduler.num_preemptions - preempted
        st.prefix_hit_tokens += bm.hit_tokens - hits
        st.prefix_query_tokens += bm.queried_tokens - queried
        self.record_paged_step(batch, lens, starts, tokens)
        scheduler.postprocess(batch)
        return batch

    def record_paged_step(self, batch: list[Sequence], lens: list[int], starts: list[int],
                          tokens: list[int | None]) -> None:
        st, bm, scheduler = self.stats, self.block_manager, self.scheduler
        st.steps += 1
        st.slot_steps_available += self.max_num_seqs
        st.slot_steps_used += len(batch)
        for seq, n, start in zip(batch, lens, starts):
            prefill = max(0, min(n, seq.num_prompt_tokens - start))
            st.prefill_tokens += prefill
            st.decode_tokens += n - prefill
        st.peak_running = max(st.peak_running, len(scheduler.running))
        per_token = self.config.kv_bytes_per_token(self.dtype.itemsize)
        st.kv_bytes_reserved = max(st.kv_bytes_reserved, bm.num_used_blocks * self.block_size * per_token)
        st.kv_bytes_used = max(st.kv_bytes_used, bm.filled_tokens(scheduler.running) * per_token)
        self.block_timeline.append(bm.num_used_blocks)
        self.timeline.append([s.index for s in batch] + [None] * (self.max_num_seqs - len(batch)))
        self._advance(sum(t is not None for t in tokens))

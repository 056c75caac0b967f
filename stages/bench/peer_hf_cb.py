"""HF continuous batching: transformers' own answer to serving many requests, beside its static `generate`.

`generate_batch` runs a paged KV cache and a scheduler in a background thread, but takes one `max_new_tokens`
for every request; its manager (`continuous_batching_context_manager`) takes requests one by one, each with
its own limit, which is what the ladder's workload needs, so that is what runs here. Settings: the same
prepared checkpoint folder and dtype as HF `generate`, sdpa attention (the paged variant transformers
switches to), greedy, every EOS id, at most `max_num_seqs` requests per batch (the in-flight limit) and the
stages' 512 tokens per step. On a CPU transformers would size its KV cache at 60% of free RAM (it reads the
machine's memory as if it were a GPU's), so the cache is sized here for the workload instead.
"""
from __future__ import annotations

import math
import time

import torch

from .baselines import Row, row

PAGE = 256  # transformers' default page size, tokens


def cache_blocks(prompts: list[list[int]], max_tokens: list[int], max_num_seqs: int) -> int:
    """Pages enough for `max_num_seqs` of the longest requests at once, past the scheduler's 15% safety margin
    (under it, no new prompt is admitted)."""
    per_request = math.ceil(max(len(p) + n for p, n in zip(prompts, max_tokens)) / PAGE) + 1
    return math.ceil(max_num_seqs * per_request / 0.85) + 1


def hf_continuous(folder, prompts: list[list[int]], max_tokens: list[int], eos: list[int], max_num_seqs: int,
                  dtype: torch.dtype, max_batch_tokens: int = 512) -> Row:
    """The ladder's row for HF continuous batching (with the tokens, to compare): every request arrives at the
    start; TTFT and TPOT from the per-token timestamps transformers records."""
    from transformers import AutoModelForCausalLM, ContinuousBatchingConfig, GenerationConfig
    from transformers.utils import logging

    logging.disable_progress_bar()
    eos_ids = list(eos) or [-1]  # [] where the workload ignores EOS: an id no token has
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").eval()
    config = GenerationConfig(do_sample=False, max_new_tokens=max(max_tokens), eos_token_id=eos_ids,
                              pad_token_id=eos_ids[0])
    cb = ContinuousBatchingConfig(max_requests_per_batch=max_num_seqs, max_batch_tokens=max_batch_tokens,
                                  num_blocks=cache_blocks(prompts, max_tokens, max_num_seqs), page_size=PAGE)
    results = {}
    with model.continuous_batching_context_manager(  # its thread writes tensors made here: no inference_mode
            generation_config=config, continuous_batching_config=cb, block=True, timeout=30) as manager:
        start = time.perf_counter()
        ids = [manager.add_request(p, max_new_tokens=n, record_timestamps=True, eos_token_id=eos_ids)
               for p, n in zip(prompts, max_tokens)]
        while len(results) < len(ids):
            out = manager.get_result(timeout=1)
            if out is not None and out.is_finished():
                results[out.request_id] = out
            elif out is None and not manager.is_running():
                raise RuntimeError(f"transformers' batching thread stopped with {len(results)} of {len(ids)} done")
        wall = time.perf_counter() - start
    outs = [results[i] for i in ids]
    failed = [o.error for o in outs if o.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed in generate_batch's manager: {failed[0]}")
    times = [o.timestamps[:len(o.generated_tokens)] for o in outs]  # one per token it kept
    r = row(f"HF continuous batching ({max_num_seqs} per batch)", len(prompts), sum(map(len, prompts)),
            sum(len(o.generated_tokens) for o in outs), wall, [t[0] - start for t in times],
            [(t[-1] - t[0]) / (len(t) - 1) for t in times if len(t) > 1])
    r["tokens"] = [list(o.generated_tokens) for o in outs]
    return r

"""What a learner would otherwise use, run on the same workload: HF `generate`, and llama.cpp.

* `hf_generate`: `transformers` on the same prepared checkpoint folder (dense weights, same
  dtype), left-padded static batches in arrival order, greedy (or sampled: the ladder's `--temperature` and
  `--top-p`), `max_new_tokens` per batch.
* `llama_cpp`: `llama-cpp-python` on the same GGUF file (its own 4-bit weights), one request
  after another, the way a script calls it. Optional: it compiles from source (minutes).

Each returns the summary row the stages' table uses, with the same definitions: output
tokens count up to and including EOS, TTFT from the start of the run (all requests arrive
at once), TPOT as the mean gap between a request's tokens.
"""
from __future__ import annotations

import time

import torch

from stages.report import percentile

Row = dict


def row(name: str, n: int, prompt_tokens: int, output_tokens: int, wall: float, ttft: list[float],
        tpot: list[float], steps: int | None = None) -> Row:
    return {"engine": name, "requests": n, "prompt tokens": prompt_tokens, "output tokens": output_tokens,
            "wall s": wall, "output tok/s": output_tokens / wall, **({"steps": steps} if steps else {}),
            "TTFT p50 s": percentile(ttft, 50), "TTFT p99 s": percentile(ttft, 99),
            "TPOT p50 ms": 1e3 * percentile(tpot, 50)}


def hf_generate(folder, prompts: list[list[int]], max_tokens: list[int], eos: list[int], batch_size: int,
                dtype: torch.dtype, temperature: float = 0.0, top_p: float = 1.0) -> Row:
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList
    from transformers.utils import logging

    logging.disable_progress_bar()

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()

    class StepClock(StoppingCriteria):  # called once per generated token: a timestamp per step
        def __call__(self, input_ids, scores, **kwargs):
            times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    start = time.perf_counter()
    out_tokens, ttft, tpot, steps = 0, [], [], 0
    for b in range(0, len(prompts), batch_size):
        batch = prompts[b:b + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[eos[0]] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        limit = max(max_tokens[b:b + batch_size])
        times: list[float] = []
        with torch.inference_mode():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=limit, eos_token_id=eos,
                                 pad_token_id=eos[0], **hf_sampling(temperature, top_p),
                                 stopping_criteria=StoppingCriteriaList([StepClock()]))
        steps += len(times)
        for i, seq in enumerate(gen[:, width:].tolist()):
            ends = [j for j, t in enumerate(seq) if t in eos]  # the first of any EOS id ends the request
            n = min(max_tokens[b + i], ends[0] + 1 if ends else len(seq))
            out_tokens += n
            ttft.append(times[0] - start)
            if n > 1:
                tpot.append((times[n - 1] - times[0]) / (n - 1))
    wall = time.perf_counter() - start
    return row(f"HF generate (batch {batch_size})", len(prompts), sum(map(len, prompts)), out_tokens, wall, ttft,
               tpot, steps)


def hf_sampling(temperature: float, top_p: float) -> dict:
    """generate()'s arguments for our sampling: greedy, or temperature and top-p alone (no top-k: HF's default of
    50 would cut what ours keeps)."""
    if temperature <= 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def llama_cpp(gguf_path, prompts: list[list[int]], max_tokens: list[int], threads: int, temperature: float = 0.0,
              top_p: float = 1.0) -> Row:
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_path), n_ctx=4096, n_threads=threads, n_batch=512, verbose=False)
    start = time.perf_counter()
    out_tokens, ttft, tpot = 0, [], []
    for prompt, limit in zip(prompts, max_tokens):
        times = []
        # temperature and top-p alone, as ours: llama.cpp's top-k (40) and min-p (0.05) off, no repeat penalty
        for chunk in llm.create_completion(prompt, max_tokens=limit, temperature=temperature, top_p=top_p, top_k=0,
                                           min_p=0.0, repeat_penalty=1.0, stream=True):
            choice = chunk["choices"][0]
            if choice["text"] or choice["finish_reason"] is None:  # the closing chunk carries no token
                times.append(time.perf_counter())
        n = len(times)
        out_tokens += n
        if times:
            ttft.append(times[0] - start)
        if n > 1:
            tpot.append((times[-1] - times[0]) / (n - 1))
        llm.reset()
    wall = time.perf_counter() - start
    return row("llama.cpp (one at a time)", len(prompts), sum(map(len, prompts)), out_tokens, wall, ttft, tpot)

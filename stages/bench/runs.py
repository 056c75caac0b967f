"""One row of the ladder: a stage (or the reference alone) run on the workload, with the figures it earned."""
from __future__ import annotations

import argparse
import copy
import math
import time
from statistics import median_low as median

import torch

from stages.cli import make_llm
from common.loader import expected_shapes
from stages.report import summary_row
from common.sampling import SamplingParams


def stage_row(module: str, args: argparse.Namespace, prompts, params, bandwidth: float, flops: float) -> dict:
    llm = make_llm(module, args)
    outputs = llm.generate(prompts, params, progress=True)
    if hasattr(llm, "shutdown"):
        llm.shutdown()
    r = summary_row(llm.stats, outputs, llm.max_num_seqs)
    st, weights = llm.stats, llm.model.weight_bytes
    # Bytes a step must read (weights once, plus KV) vs time: bandwidth use; 2 FLOP per weight per token: compute use.
    per_token = llm.config.kv_bytes_per_token(llm.dtype.itemsize)
    kv_read = sum(len(o.prompt_token_ids) + len(o.token_ids) / 2 for o in outputs) * per_token
    params_count = sum(math.prod(shape) for shape in expected_shapes(llm.config).values())
    r["bandwidth use"] = (st.steps * weights + kv_read) / st.wall_seconds / bandwidth
    r["compute use"] = 2 * params_count * (st.prefill_tokens + st.decode_tokens) / st.wall_seconds / flops
    r["tokens"] = [o.token_ids for o in outputs]
    return r


def median_run(runs: list[dict]) -> dict:
    """The run with the median output tok/s (the lower middle of an even count), its tokens kept only if every
    run gave the same ones, and every run's rate listed."""
    middle = sorted(runs, key=lambda r: r["output tok/s"])[(len(runs) - 1) // 2]
    row = dict(middle, tokens=middle["tokens"] if all(r["tokens"] == middle["tokens"] for r in runs) else None)
    if len(runs) > 1:
        row["rounds tok/s"] = " / ".join(f"{r['output tok/s']:.1f}" for r in runs)
        row["rounds"] = [r["output tok/s"] for r in runs]  # the verdict's spread
    return row


def decode_rate(token_times: list[float]) -> float:
    """Tokens per second after the first (the decode pace)."""
    return (len(token_times) - 1) / (token_times[-1] - token_times[0])


def single_request(llm, prompt: list[int], read_bandwidth: float, tokens: int = 128, rounds: int = 1) -> dict:
    """One request alone through the reference: its decode rate (the median of ``rounds`` runs) against the
    ceiling of reading every weight once per token at the machine's read bandwidth."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm
    rates = [decode_rate(llm.generate([prompt], params)[0].metrics.token_times) for _ in range(rounds)]
    rate, ceiling = median(rates), read_bandwidth / llm.model.weight_bytes
    row = {"tokens": tokens, "decode tok/s": rate, "ceiling tok/s": ceiling, "of ceiling": rate / ceiling,
           "weight MB": llm.model.weight_bytes / 1e6}
    if rounds > 1:
        row["rounds decode tok/s"] = " / ".join(f"{r:.1f}" for r in rates)
    return row


def stage_single_request(module: str, args: argparse.Namespace, prompt: list[int], read_bandwidth: float,
                         rounds: int = 1) -> dict:
    """One request alone through a stage built with one slot, timed as `single_request` times the reference."""
    one = copy.copy(args)
    one.max_num_seqs = 1
    llm = make_llm(module, one)
    try:
        return single_request(llm, prompt, read_bandwidth, rounds=rounds)
    finally:
        if hasattr(llm, "shutdown"):
            llm.shutdown()


def hf_single_request(folder, prompt: list[int], dtype: torch.dtype, tokens: int = 128, rounds: int = 1) -> float:
    """HF `generate` at batch 1, same prompt and token count: decode tokens per second (timed per token), the
    median of ``rounds`` runs."""
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    times: list[float] = []

    class StepClock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    ids, rates = torch.tensor([prompt]), []
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm
        for _ in range(rounds):
            times.clear()
            model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           stopping_criteria=StoppingCriteriaList([StepClock()]))
            rates.append(decode_rate(times))
    return median(rates)

"""Set the batch limit from a latency target: the largest `max_num_seqs` whose decode step meets it.

A bigger batch raises throughput but every request in it waits for the whole step, so each
user's time per output token (TPOT) grows with the batch. `measure_step_times` times decode
steps at a few batch sizes on this machine (requests of equal length admitted in one step
decode in lock step, so each one's TPOT is the step time at that batch size); `choose_max_num_seqs`
picks the largest batch whose step time, and every smaller batch's, meets the target.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from common.sampling import SamplingParams

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Calibration:
    tpot_target_ms: float
    step_ms: dict[int, float]  # batch size -> measured decode step time
    max_num_seqs: int
    device: str  # where it was measured (the replicas' kind of machine)

    def table(self) -> str:
        rows = [f"  batch {b:>3}: {ms:7.1f} ms per token{'  <- chosen' if b == self.max_num_seqs else ''}"
                for b, ms in sorted(self.step_ms.items())]
        met = self.step_ms.get(self.max_num_seqs, float("inf")) <= self.tpot_target_ms
        note = "" if met else f" (no batch meets {self.tpot_target_ms:g} ms: the smallest is used)"
        return "\n".join([f"calibration on {self.device}: max_num_seqs={self.max_num_seqs} for a TPOT target of "
                          f"{self.tpot_target_ms:g} ms{note}", *rows])


def choose_max_num_seqs(step_ms: dict[int, float], tpot_target_ms: float) -> int:
    """The largest batch size that, like every smaller one measured, meets the target; the smallest if none does.
    (Step time grows with the batch; a larger batch that measured faster than a smaller one is noise.)"""
    if not step_ms:
        raise ValueError("no step times were measured")
    sizes = sorted(step_ms)
    chosen = sizes[0]
    for b in sizes:
        if step_ms[b] > tpot_target_ms:
            break
        chosen = b
    return chosen


def measure_step_times(llm, batch_sizes=BATCH_SIZES, context: int = 32, steps: int = 12,
                       stop_above_ms: float | None = None) -> dict[int, float]:
    """Median decode-step time (ms) at each batch size; stops after the first size slower than ``stop_above_ms``
    (larger batches only take longer). ``llm`` must admit ``max(batch_sizes)`` requests of ``context`` tokens
    in one step."""
    vocab = llm.config.vocab_size
    params = SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True)
    llm.generate([[3, 4, 5]], SamplingParams(max_tokens=3, temperature=0))  # warm-up: first calls are slow
    times = {}
    for b in batch_sizes:
        # distinct prompts: no prefix-cache hit makes one request skip its prefill
        prompts = [[(7 + 31 * i + 7 * t) % (vocab - 3) + 3 for t in range(context)] for i in range(b)]
        outputs = llm.generate(prompts, params)
        times[b] = 1e3 * statistics.median(o.metrics.time_per_output_token for o in outputs)
        if stop_above_ms is not None and times[b] > stop_above_ms:
            break
    return times


def calibrate(model: str, tpot_target_ms: float, dtype: str = "bfloat16", device: str = "cpu",
              torch_threads: int | None = 1, batch_sizes=BATCH_SIZES) -> Calibration:
    """Load the model with room for the largest batch, measure, choose (what each replica would do)."""
    import torch
    if torch_threads:
        torch.set_num_threads(torch_threads)
    from stages import streaming
    context, steps, most = 32, 12, max(batch_sizes)
    llm = streaming.LLM(model, dtype=dtype, device=device, max_num_seqs=most, max_model_len=context + steps + 8,
                        max_num_batched_tokens=most * context)
    try:
        step_ms = measure_step_times(llm, batch_sizes, context, steps, stop_above_ms=tpot_target_ms)
    finally:
        llm.shutdown()
    return Calibration(tpot_target_ms, step_ms, choose_max_num_seqs(step_ms, tpot_target_ms), str(llm.device))

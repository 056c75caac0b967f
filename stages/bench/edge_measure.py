"""The edge tool's measurements, each run in a fresh process (``python -m stages.bench.edge --child ...``):
one precision of stepwise, the three precisions side by side, or llama.cpp on the GGUF."""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from common.paths import DEFAULT_MODEL
from stages import kernels as stage_04

LONG_PROMPT = 512


def precisions() -> tuple[str, ...]:
    """What the edge lesson measures: bfloat16 ("none"), int8, int4, and w4a8 where our kernels built (it has no
    other kernel)."""
    from common.numerics import native
    return ("none", "int8", "int4") + (("w4a8",) if native.w4a8_kernel() else ())


def memory_mb(field: str) -> float:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


def prompts(tokenizer) -> tuple[list[int], list[int]]:
    from stages.bench.quality import TEXT
    chat = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "How do vaccines work?"}]))
    return chat, tokenizer.encode(TEXT.read_text(encoding="utf-8"))[:LONG_PROMPT]


def decode_times(token_times: list[float]) -> float:
    return (token_times[-1] - token_times[0]) / (len(token_times) - 1)


def measure_stepwise(model: str, quantization: str | None, tokens: int) -> dict:
    """In a fresh process: load (memory), then one request alone (time per token, time to first token)."""
    from common import ReferenceLLM, SamplingParams

    before = memory_mb("VmRSS")
    llm = ReferenceLLM(model, dtype="bfloat16", quantization=quantization)
    row = {"weight MB": llm.model.weight_bytes / 1e6, "peak MB at load": memory_mb("VmHWM"),
           "load MB over bare process": memory_mb("VmHWM") - before, "resident MB after load": memory_mb("VmRSS")}
    chat, long = prompts(llm.tokenizer)
    llm.generate([chat], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    m = llm.generate([chat], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))[0].metrics
    row.update({"ms per token": 1e3 * decode_times(m.token_times),
                f"TTFT ms, {len(chat)}-token prompt": 1e3 * m.time_to_first_token})
    m = llm.generate([long], SamplingParams(temperature=0, max_tokens=1))[0].metrics
    row[f"TTFT ms, {len(long)}-token prompt"] = 1e3 * m.time_to_first_token
    # The same request through stage 04, whose fused CPU kernels the reference does not use (same tokens).
    kernels = stage_04.LLM(model, dtype="bfloat16", quantization=quantization,
                                                                max_num_seqs=1)
    kernels.generate([chat], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    m = kernels.generate([chat], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))[0].metrics
    row["ms per token, stage 04"] = 1e3 * decode_times(m.token_times)
    row.update(linear_breakdown(kernels, chat, tokens))
    row["rest of the step ms, stage 04"] = row["ms per token, stage 04"] - row["linears ms per token, stage 04"]
    return row


def measure_side_by_side(model: str, tokens: int, alternations: int) -> dict[str, list[float]]:
    """In one process: stage 04 in every precision, one request alone, decoding the same prompt in turns (each
    turn a fresh request; the order rotates every turn), so that the times a ratio divides were taken within
    about a second of each other. Per precision, ms per token of every turn."""
    from common import SamplingParams

    engines = {("bfloat16" if q == "none" else q): stage_04.LLM(model, dtype="bfloat16", max_num_seqs=1,
                                                             quantization=None if q == "none" else q)
               for q in precisions()}
    chat, _ = prompts(engines["bfloat16"].tokenizer)
    for llm in engines.values():  # warm-up
        llm.generate([chat], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    names, times = list(engines), defaultdict(list)
    for turn in range(alternations):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            out = engines[name].generate([chat], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
            times[name].append(1e3 * decode_times(out[0].metrics.token_times))
    return dict(times)


def side_by_side_ratios(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """int8, int4 and w4a8 against bfloat16, turn by turn (each a quotient of two times from the same turn)."""
    return {f"{q} / bfloat16, stage 04": [b / t for b, t in zip(times["bfloat16"], times[q])]
            for q in ("int8", "int4", "w4a8") if q in times}


def time_per_call_fit(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``seconds = fixed + bytes / bandwidth`` over (bytes, seconds) samples: (fixed s, bytes/s)."""
    nbytes, seconds = np.asarray(samples, dtype=float).T
    per_byte, fixed = np.polyfit(nbytes, seconds, 1)
    return float(fixed), float(1 / per_byte)


def linear_breakdown(llm, prompt: list[int], tokens: int) -> dict:
    """Decode ``tokens`` tokens of one request with a timer around every linear call; each linear's median
    call, their sum per token, and the fit of those medians against the bytes each linear reads."""
    from common import SamplingParams
    from common.numerics.invariant import RowTiled

    calls, untimed = defaultdict(list), RowTiled.__call__

    def timed(linear, x):
        start = time.perf_counter()
        out = untimed(linear, x)
        if x.shape[0] == 1:  # decode steps only, not the prompt
            calls[linear].append(time.perf_counter() - start)
        return out

    RowTiled.__call__ = timed
    try:
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    finally:
        RowTiled.__call__ = untimed
    medians = {linear: float(np.median(t)) for linear, t in calls.items()}
    # The fit takes the layers' projections: the LM head is the int8 token table in int4 mode, another kernel.
    projections = [(linear.nbytes, t) for linear, t in medians.items() if linear is not llm.model.lm_head]
    fixed, bandwidth = time_per_call_fit(projections)
    return {"linears ms per token, stage 04": 1e3 * sum(medians.values()),
            "projections GB/s (fit)": bandwidth / 1e9, "µs per projection call besides bytes (fit)": 1e6 * fixed,
            "linear calls per token": len(medians)}


def measure_llama_cpp(tokens: int, threads: int, gguf_path: str | None = None) -> dict:
    """llama.cpp on the GGUF file itself (memory-mapped; SmolLM2's unless ``gguf_path``, e.g. a scale shape's
    model-q4_1.gguf, which has SmolLM2's tokenizer too), one request alone, greedy, EOS ignored."""
    import gguf
    from llama_cpp import Llama

    from common.paths import smollm2_gguf_path
    from common.prepare import resolve_model
    from common.tokenizer import Tokenizer

    path = gguf_path or smollm2_gguf_path()
    weights = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)
    before = memory_mb("VmRSS")
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    row = {"weight MB": weights / 1e6, "peak MB at load": memory_mb("VmHWM"),
           "load MB over bare process": memory_mb("VmHWM") - before, "resident MB after load": memory_mb("VmRSS")}
    chat, long = prompts(Tokenizer(resolve_model(DEFAULT_MODEL)))

    def run(prompt, n):
        llm.reset()
        start, times = time.perf_counter(), []
        for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            times.append(time.perf_counter())
            if len(times) == n:
                break
        return start, times

    run(chat, 4)  # warm-up
    start, times = run(chat, tokens)
    row.update({"ms per token": 1e3 * decode_times(times),
                f"TTFT ms, {len(chat)}-token prompt": 1e3 * (times[0] - start)})
    start, times = run(long, 1)
    row[f"TTFT ms, {len(long)}-token prompt"] = 1e3 * (times[0] - start)
    return row


"""One point of the sweep, alone in this process: ``python -m stages.bench.scale_run '<point as JSON>'`` prints
one ``RESULT {...}`` line (stages/bench/scale.py starts one child per point, so engines never share a process).

Every request arrives at the start with a prompt of ``prompt`` random token ids (seeded: every engine gets the same
prompts) and decodes ``out_tokens`` tokens greedily, EOS ignored. Figures: TTFT (arrival to first token, p50),
prefill tok/s (prompt tokens over the time to the last first token), TPOT (a request's time between its first and
last token per token, p50), decode tok/s (requests in flight over TPOT: the steady rate with all of them decoding),
output tok/s (all output tokens over the wall time).
"""
from __future__ import annotations

import json
import sys
import time
from statistics import median

import numpy as np

from .scale_plan import GGUF_FILES, Point


WARM = [3, 4, 5, 6, 7, 8, 9, 10]  # a warm-up prompt no point's prompt starts with (2 < id: never EOS)


def prompts_for(point: Point, vocab: int = 49152) -> list[list[int]]:
    rng = np.random.default_rng(1234 + point.prompt)
    return [rng.integers(11, vocab, point.prompt).tolist() for _ in range(point.in_flight)]


def summary(arrival: float, firsts: list[float], token_times: list[list[float]], prompt_tokens: int,
            end: float) -> dict:
    return summary_of_ends(arrival, firsts, [(t[0], t[-1], len(t)) for t in token_times], prompt_tokens, end)


def summary_of_ends(arrival: float, firsts: list[float], ends: list[tuple[float, float, int]], prompt_tokens: int,
                    end: float) -> dict:
    """The point's figures from each request's first and last token times and token count (vLLM keeps no more)."""
    tpot = [(last - first) / (n - 1) for first, last, n in ends if n > 1]
    out = sum(n for _, _, n in ends)
    tpot_s = median(tpot) if tpot else float("nan")
    return {"TTFT s": median(f - arrival for f in firsts), "prefill tok/s": prompt_tokens / (max(firsts) - arrival),
            "TPOT ms": 1e3 * tpot_s, "decode tok/s": len(ends) / tpot_s, "output tok/s": out / (end - arrival)}


def budget(point: Point) -> int:
    """Tokens a step may feed, the same for the stages and vLLM (the stages' default; llama.cpp's batch is 512 too)."""
    return max(512, point.in_flight)


def run_stage(point: Point, prompts: list[list[int]]) -> dict:
    import importlib

    from common import SamplingParams

    stage, precision = point.engine.split("-")
    module = importlib.import_module({"04": "stages.kernels", "05": "stages.streaming"}[stage])
    llm = module.LLM(point.folder, dtype="bfloat16", quantization=None if precision == "bf16" else precision,
                     max_num_seqs=point.in_flight, max_model_len=-(-(point.prompt + point.out_tokens + 1) // 16) * 16,
                     max_num_batched_tokens=budget(point))
    params = SamplingParams(temperature=0, max_tokens=point.out_tokens, ignore_eos=True)
    llm.generate([WARM], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm (no shared prefix)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    end = time.perf_counter()
    failed = [o.error for o in outs if o.error]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed: {failed[0]}")
    figures = summary(start, [o.metrics.token_times[0] for o in outs], [o.metrics.token_times for o in outs],
                      sum(map(len, prompts)), end)
    figures["weight bytes"] = llm.model.weight_bytes
    if hasattr(llm, "shutdown"):
        llm.shutdown()
    return figures | {"tokens": [o.token_ids for o in outs]}


def run_llama_cpp(point: Point, prompts: list[list[int]]) -> dict:
    from pathlib import Path

    from .peer_llama_cpp import generate, open_context

    path = Path(point.folder) / GGUF_FILES[point.engine]
    ctx = open_context(path, prompts, [point.out_tokens] * len(prompts), point.in_flight)
    try:
        generate(ctx, [WARM], [2], set(), 1)  # warm: the first decode allocates the buffers
        start = time.perf_counter()
        slots, _ = generate(ctx, prompts, [point.out_tokens] * len(prompts), set(), point.in_flight)
        end = time.perf_counter()
    finally:
        ctx.close()
    figures = summary(start, [s.times[0] for s in slots], [s.times for s in slots], sum(map(len, prompts)), end)
    return figures | {"weight bytes": path.stat().st_size, "tokens": [s.tokens for s in slots]}


def run_vllm(point: Point, prompts: list[list[int]]) -> dict:
    """vLLM's offline `LLM` in its own venv (peer_vllm.py), told the stages' step budget (a prefill's steps stall
    the decodes beside it, and TPOT counts them), the point's context (the shape's own, 131,072 tokens at 1B, would
    not fit its KV space) and to ignore EOS; its start, compile and warm-up request are outside the timed run; the
    engine core's first and last token times of each request."""
    from pathlib import Path

    from .peer_vllm import run_vllm as run, settings_for

    settings, _ = settings_for(point.folder, prompts, [point.out_tokens] * len(prompts), [], point.in_flight,
                               "bfloat16")
    result = run(settings | {"max_model_len": point.prompt + point.out_tokens + 16,
                             "max_num_batched_tokens": budget(point)})
    ends = [(r["first_token_s"], r["last_token_s"], len(r["token_ids"])) for r in result["requests"]]
    figures = summary_of_ends(0.0, [e[0] for e in ends], ends, sum(map(len, prompts)), result["wall_s"])
    return figures | {"weight bytes": (Path(point.folder) / "model.safetensors").stat().st_size,
                      "tokens": [r["token_ids"] for r in result["requests"]]}


def run_point(point: Point) -> dict:
    prompts = prompts_for(point)
    if point.engine.startswith("llama.cpp"):
        return run_llama_cpp(point, prompts)
    if point.engine.startswith("vllm"):
        return run_vllm(point, prompts)
    return run_stage(point, prompts)


def main(argv: list[str] | None = None) -> int:
    point = Point(**json.loads((argv or sys.argv[1:])[0]))
    print("RESULT " + json.dumps(run_point(point)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One point of the sweep, alone in this process: ``python -m stages.bench.scale_run '<point as JSON>'`` prints
one ``RESULT {...}`` line (stages/bench/scale.py starts one child per point, so engines never share a process).

Every request arrives at the start with a prompt of ``prompt`` random token ids (seeded: every engine gets the same
prompts) and decodes ``out_tokens`` tokens greedily, EOS ignored. Figures, from each request's output-token times
(each token stamped at the end of the step that made it, for every engine):
* TTFT p50: arrival to first token, the median request;
* prefill tok/s: prompt tokens over the time to the last first token;
* TPOT p50: a request's (last - first token time) / (tokens - 1), the median request: what a user waits per token,
  stalls included (the steps that prefill other requests' prompts after its first token count in it);
* steady decode tok/s: output tokens made while every request was decoding, over that window (steady.py): the
  engine's decode step with all of them in the batch; None ("n/a") when a request finished before the last one had
  its first token;
* in flight / TPOT p50 tok/s: the figure this sweep printed as "decode tok/s" until 2026-12-07, kept to compare with
  the tables of that date (docs/scale.md); it mixes the prefill stall into a decode rate;
* output tok/s: all output tokens over the wall time.
"""
from __future__ import annotations

import json
import sys
import time
from statistics import median

import numpy as np

from .scale_plan import GGUF_FILES, Point
from .steady import StepEnds, on_step_ends, steady_decode


WARM = [3, 4, 5, 6, 7, 8, 9, 10]  # a warm-up prompt no point's prompt starts with (2 < id: never EOS)


def prompts_for(point: Point, vocab: int = 49152) -> list[list[int]]:
    rng = np.random.default_rng(1234 + point.prompt)
    return [rng.integers(11, vocab, point.prompt).tolist() for _ in range(point.in_flight)]


def summary(arrival: float, token_times: list[list[float]], prompt_tokens: int, end: float) -> dict:
    """The point's figures from each request's output-token times (seconds, on the clock ``arrival`` is on)."""
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for t in token_times if len(t) > 1]
    tpot_s = median(tpot) if tpot else float("nan")
    firsts = [t[0] for t in token_times]
    return {"TTFT p50 s": median(f - arrival for f in firsts), "prefill tok/s": prompt_tokens / (max(firsts) - arrival),
            "TPOT p50 ms": 1e3 * tpot_s, "in flight / TPOT p50 tok/s": len(token_times) / tpot_s,
            "output tok/s": sum(map(len, token_times)) / (end - arrival)} | steady_decode(token_times)


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
    steps = llm.add_observer(StepEnds())  # each token's time becomes its step's end, as the peers stamp theirs
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    end = time.perf_counter()
    failed = [o.error for o in outs if o.error]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed: {failed[0]}")
    figures = summary(start, [on_step_ends(o.metrics.token_times, steps.times) for o in outs],
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
    figures = summary(start, [s.times for s in slots], sum(map(len, prompts)), end)  # one time per llama_decode
    return figures | {"weight bytes": path.stat().st_size, "tokens": [s.tokens for s in slots]}


def run_vllm(point: Point, prompts: list[list[int]]) -> dict:
    """vLLM's engine in its own venv (peer_vllm.py), stepped by the runner so that each token has its step's time
    (the engine core's stamp), told the stages' step budget (a prefill's steps stall the decodes beside it, and
    TPOT counts them), the point's context (the shape's own, 131,072 tokens at 1B, would not fit its KV space) and
    to ignore EOS; its start, compile and warm-up request are outside the timed run."""
    from pathlib import Path

    from .peer_vllm import run_vllm as run, settings_for

    settings, _ = settings_for(point.folder, prompts, [point.out_tokens] * len(prompts), [], point.in_flight,
                               "bfloat16")
    result = run(settings | {"max_model_len": point.prompt + point.out_tokens + 16,
                             "max_num_batched_tokens": budget(point)})
    if any(len(r.get("token_s") or ()) != len(r["token_ids"]) for r in result["requests"]):
        raise RuntimeError("vLLM's runner returned no time for some token (token_s): is vllm_runner.py current?")
    figures = summary(0.0, [r["token_s"] for r in result["requests"]], sum(map(len, prompts)), result["wall_s"])
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

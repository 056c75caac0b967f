"""The steady decode rate of a run: output tokens a second while every request of the run is decoding.

Why not requests in flight / TPOT: a request's time per output token (TPOT, (last - first) / (tokens - 1)) counts
every step between its first and last token, and with many requests arriving at once some of those steps prefill
the other requests' prompts. At 16 prompts of 128 tokens under a 512-token step budget, a request admitted in the
first step waits through three more 512-token prefill steps after its first token, so its TPOT mixes the decode
step with the prefill stall. TPOT is what a user waits per token (the sweep keeps its p50); the steady rate is what
the engine's decode step does once the prompts are in.

The window: from the last first token (every request has its first token: no prompt left to prefill) to the first
last token (no request has finished yet: all are still in the batch). The rate is the output tokens made in that
window over its length. Tokens are counted by the step that made them: a token stamped at the window's start came
from the step that ended there (outside), one stamped at its end from the step that ended there (inside). If a
request finished before the last one had its first token, no moment had every request decoding: no figure (None,
"n/a"), rather than one that mixes prefill in.

Every engine's token times are its steps' end times: llama.cpp's loop stamps each `llama_decode`'s tokens once
(peer_llama_cpp.generate), vLLM's engine core each step's outputs (vllm_runner.py); the stages stamp each token as
it is appended, microseconds apart within a step, so ``on_step_ends`` moves each to the end of its step.
"""
from __future__ import annotations

import time
from bisect import bisect_left


def steady_decode(token_times: list[list[float]]) -> dict:
    """``token_times``: each request's output-token times, in order. Returns "steady decode tok/s" (None when no
    window exists), "steady tokens" (made inside the window) and "steady window s" (its length, 0 when none)."""
    if not token_times or not all(token_times):
        raise ValueError("steady_decode: every request needs at least one output token time")
    start = max(times[0] for times in token_times)  # the last first token: every prompt is in
    end = min(times[-1] for times in token_times)  # the first last token: nobody has left yet
    if end <= start:
        return {"steady decode tok/s": None, "steady tokens": 0, "steady window s": 0.0}
    tokens = sum(start < t <= end for times in token_times for t in times)
    return {"steady decode tok/s": tokens / (end - start), "steady tokens": tokens, "steady window s": end - start}


class StepEnds:
    """An observer of a stage's `LLM` (``llm.add_observer``): the time each step ended, after its tokens were
    appended."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step(self, event) -> None:
        self.times.append(time.perf_counter())


def on_step_ends(token_times: list[float], step_ends: list[float]) -> list[float]:
    """Each token's time moved to the end of the step that made it: the first step end at or after it."""
    if token_times and (not step_ends or token_times[-1] > step_ends[-1]):
        raise ValueError("on_step_ends: a token came after the last step end (was the observer attached?)")
    return [step_ends[bisect_left(step_ends, t)] for t in token_times]

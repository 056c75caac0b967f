"""Runs INSIDE .venv-vllm (vLLM's own torch and transformers): one workload through vLLM's offline `LLM`.

    .venv-vllm/bin/python stages/bench/vllm_runner.py settings.json result.json

stages/bench/peer_vllm.py writes the settings (prompt token ids, max_tokens, stop ids, in-flight limit, dtype)
and reads the result back; it also sets vLLM's CPU environment (threads bind, KV space, preloads). This file
imports only the standard library and vLLM, since stepwise's own packages are not installed in that venv.

Three phases, timed apart: start (building `LLM`: loading weights, compiling, warming up), one short warm
request, then the timed run with every request given at once. Per request it returns vLLM's own token ids and
finish reason and the engine core's timestamps of its first and last token (`RequestOutput.metrics`, kept
only with `disable_log_stats=False`), as seconds after the timed run began (both are `time.monotonic()`).
"""
import json
import sys
import time


def run(settings: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    limits = {k: settings[k] for k in ("max_model_len", "max_num_batched_tokens") if settings.get(k)}  # else vLLM's
    llm = LLM(model=settings["folder"], dtype=settings["dtype"], max_num_seqs=settings["max_num_seqs"],
              seed=0, disable_log_stats=False, **limits)
    start_s = time.perf_counter() - t0

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=settings["stop_token_ids"],
                              ignore_eos=settings["ignore_eos"])

    prompts = [TokensPrompt(prompt_token_ids=p) for p in settings["prompts"]]
    t0 = time.perf_counter()
    llm.generate(prompts[:1], params(4), use_tqdm=False)  # warm: the first step after start can be slow
    warm_s = time.perf_counter() - t0

    start = time.monotonic()
    outputs = llm.generate(prompts, [params(m) for m in settings["max_tokens"]], use_tqdm=False)
    wall = time.monotonic() - start
    requests = []
    for out in outputs:
        done, m = out.outputs[0], out.metrics
        requests.append({"token_ids": list(done.token_ids), "finish_reason": done.finish_reason,
                         "stop_reason": done.stop_reason if isinstance(done.stop_reason, int) else None,
                         "first_token_s": m.first_token_ts - start if m else None,
                         "last_token_s": m.last_token_ts - start if m else None})
    import vllm

    return {"vllm": vllm.__version__, "start_s": start_s, "warm_s": warm_s, "wall_s": wall, "requests": requests}


if __name__ == "__main__":  # guarded: vLLM spawns its engine core process, which re-imports this file
    with open(sys.argv[1]) as f:
        result = run(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)

"""Runs INSIDE .venv-vllm (vLLM's own torch and transformers): one workload through vLLM's offline `LLM`.

    .venv-vllm/bin/python stages/bench/vllm_runner.py settings.json result.json

stages/bench/peer_vllm.py writes the settings (prompt token ids, max_tokens, stop ids, in-flight limit, dtype)
and reads the result back; it also sets vLLM's CPU environment (threads bind, KV space, preloads). This file
imports only the standard library and vLLM, since stepwise's own packages are not installed in that venv.

Three phases, timed apart: start (building `LLM`: loading weights, compiling, warming up), one short warm
request, then the timed run with every request given at once. The timed run steps vLLM's engine itself
(`LLM.llm_engine`: `add_request`, then `step()` until no request is left, as `LLM.generate` does inside) with
each request's output kind DELTA, so every step hands back the tokens it made; each token gets the engine core's
timestamp of that step (`RequestOutput.metrics.last_token_ts`, kept only with `disable_log_stats=False`: the same
stamp vLLM's own first and last token times come from). `LLM.generate` asks for the final output only, which
keeps the first and last token times alone, not enough for the sweep's steady decode rate (stages/bench/steady.py).
Per request it returns vLLM's token ids, finish reason, and each token's time ("token_s") with the first and last
("first_token_s", "last_token_s"), as seconds after the timed run began (all `time.monotonic()`).
"""
import json
import sys
import time


def timed_run(llm, prompts: list, params: list, start: float) -> list[dict]:
    """Every prompt added at once, then vLLM's engine stepped to the end; each step's new tokens timed."""
    from vllm.sampling_params import RequestOutputKind

    engine, requests = llm.llm_engine, {}
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        p.output_kind = RequestOutputKind.DELTA  # every step's new tokens, not only the final output
        engine.add_request(f"timed-{i}", prompt, p)
        requests[f"timed-{i}"] = {"token_ids": [], "token_s": [], "finish_reason": None, "stop_reason": None}
    while engine.has_unfinished_requests():
        for out in engine.step():
            r, done = requests[out.request_id], out.outputs[0]
            stamp = out.metrics.last_token_ts if out.metrics else time.monotonic()  # the engine core's step time
            r["token_ids"] += list(done.token_ids)
            r["token_s"] += [stamp - start] * len(done.token_ids)
            if out.finished:
                r["finish_reason"] = done.finish_reason
                r["stop_reason"] = done.stop_reason if isinstance(done.stop_reason, int) else None
    for r in requests.values():
        r["first_token_s"], r["last_token_s"] = (r["token_s"][0], r["token_s"][-1]) if r["token_s"] else (None, None)
    return list(requests.values())


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
    requests = timed_run(llm, prompts, [params(m) for m in settings["max_tokens"]], start)
    wall = time.monotonic() - start
    import vllm

    return {"vllm": vllm.__version__, "start_s": start_s, "warm_s": warm_s, "wall_s": wall, "requests": requests}


if __name__ == "__main__":  # guarded: vLLM spawns its engine core process, which re-imports this file
    with open(sys.argv[1]) as f:
        result = run(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)

"""`python -m stages.bench.decode_attention --model FOLDER --precision int4 --prompts 128,8192`: one request at a
time through stage 04, as the scale sweep runs it (bfloat16 activations and KV cache, the precision for the
linears), printing each prompt's time per output token and how much of a decode step the compiled attention, the
linears (the projections, the MLP and the LM head, whatever their precision: `RowTiled.__call__`) and the rest took.

Why: issue 54 asks how the time per token grows from 128 to 8k tokens of context; two points of the scale sweep
say only that it grew, not where. This times the pieces inside the decode steps (`NativeTable.attention` and the
linears, wrapped in this process only) so that each share is read directly: where the time per token swings
between runs on a shared VM, it shows which piece swung. CPU only (where the compiled kernel runs). docs/scale.md
quotes it.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model folder (stages.bench.make_model's output)")
    ap.add_argument("--precision", default="int4", help="bf16, int8 or int4: the linears' (default int4)")
    ap.add_argument("--prompts", default="128,8192", help="prompt lengths, comma-separated (default 128,8192)")
    ap.add_argument("--tokens", type=int, default=33, help="output tokens per prompt (default 33)")
    args = ap.parse_args(argv)
    prompts = [int(p) for p in args.prompts.split(",")]

    from common import SamplingParams
    from common.numerics import attention_native, invariant
    from stages import kernels

    timed = {"seconds": 0.0, "calls": 0, "linears": 0.0}
    attend, linear_call = attention_native.NativeTable.attention, invariant.RowTiled.__call__

    def timed_attention(table, q, k_chunks, v_chunks):
        start = time.perf_counter()
        out = attend(table, q, k_chunks, v_chunks)
        if q.shape[0] == 1:  # a decode step of the one request (a prefill chunk has more rows)
            timed["seconds"] += time.perf_counter() - start
            timed["calls"] += 1
        return out

    def timed_linear(linear, x):
        start = time.perf_counter()
        out = linear_call(linear, x)
        if x.shape[0] == 1:  # a decode step's row
            timed["linears"] += time.perf_counter() - start
        return out

    attention_native.NativeTable.attention, invariant.RowTiled.__call__ = timed_attention, timed_linear
    try:
        quantization = None if args.precision == "bf16" else args.precision
        max_len = -(-(max(prompts) + args.tokens + 1) // 16) * 16
        llm = kernels.LLM(args.model, dtype="bfloat16", quantization=quantization, max_num_seqs=1,
                          max_model_len=max_len, max_num_batched_tokens=512)
        layers = llm.model.config.num_hidden_layers
        print(f"{args.model}: {args.precision} linears, {llm.execution_path}")
        warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        llm.generate([[3, 4, 5, 6, 7, 8, 9, 10]], warm)  # as the sweep warms: no prompt shares its prefix
        for n in prompts:
            ids = np.random.default_rng(1234 + n).integers(11, 49152, n).tolist()
            timed.update(seconds=0.0, calls=0, linears=0.0)
            out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True))[0]
            if out.error:
                raise SystemExit(f"prompt {n}: {out.error}")
            gaps = np.diff(out.metrics.token_times)
            steps = timed["calls"] / layers
            attention, linears = 1e3 * timed["seconds"] / steps, 1e3 * timed["linears"] / steps
            print(f"prompt {n:5d}: TPOT {1e3 * np.median(gaps):6.1f} ms (p10 {1e3 * np.percentile(gaps, 10):.1f}), "
                  f"attention {attention:6.2f} ms a decode step, linears {linears:6.2f} ms, the rest "
                  f"{1e3 * np.mean(gaps) - attention - linears:5.2f} ms of the mean ({steps:.0f} steps)")
    finally:  # this process's other engines time nothing
        attention_native.NativeTable.attention, invariant.RowTiled.__call__ = attend, linear_call


if __name__ == "__main__":
    main()

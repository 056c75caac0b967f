"""`python -m stages.bench.decode_step --model FOLDER --precision bf16,int4 --in-flight 16`: where a decode step of
many requests goes, through stage 04 as the scale sweep runs it (the same prompts, token budget and warm-up).

Why: the sweep's TPOT p50 (and its "decode tok/s" until 2026-12-07, in-flight / TPOT p50) counts every step between
a request's first and last token, including the steps that prefill the later requests' prompts (512-token chunks
under the sweep's budget); the sweep's steady decode rate (steady.py) is the decode-only steps' rate, untimed
inside. This prints both the sweep's TPOT and the steps that decoded only (every row one token), with each part of
them timed in this process (perf_counter around the scheduler, the cache's addressing, the linears by name, the
compiled attention, the fused element-wise kernels; "the rest" is the step's wall time less those: the embedding,
the logits' float32, sampling, Python between). Then each linear alone at the step's rows, for the sum of the
linears without the rest. CPU only. docs/scale.md quotes it.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np


def timed(owner, name: str, part, step: dict) -> None:
    """Wrap ``owner.name`` so that its seconds add to ``step[part(args)]`` (a part name, or None: not counted)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        key = part(*args)
        if key is not None:
            step[key] += time.perf_counter() - start
        return out
    setattr(owner, name, wrapper)


def run(folder: str, precision: str, in_flight: int, prompt: int, tokens: int) -> dict:
    """One sweep-like run, its decode-only steps timed by part (seconds a step), and its tokens."""
    from common import SamplingParams
    from common.numerics import attention_native, invariant
    from stages import kernels
    from stages.bench.scale_plan import Point
    from stages.bench.scale_run import WARM, prompts_for

    llm = kernels.LLM(folder, dtype="bfloat16", quantization=None if precision == "bf16" else precision,
                      max_num_seqs=in_flight, max_model_len=-(-(prompt + tokens + 1) // 16) * 16,
                      max_num_batched_tokens=max(512, in_flight))  # scale_run's settings
    model, engine = llm.model, llm.engine
    names = {id(layer[n]): n for layer in model.layers for n in ("qkv", "o", "gate_up", "down")}
    names[id(model.lm_head)] = "lm_head"
    step, lens = defaultdict(float), []
    call, attend = invariant.RowTiled.__call__, attention_native.NativeTable.attention  # put back after
    try:
        timed(invariant.RowTiled, "__call__", lambda lin, x: f"linear {names.get(id(lin), '?')}", step)
        timed(attention_native.NativeTable, "attention", lambda *a: "attention", step)
        timed(model, "add_rms_norm", lambda *a: "norms", step)
        timed(model, "swiglu", lambda *a: "swiglu", step)
        if model.fused is not None:
            timed(model.fused, "rope_qk_store", lambda *a: "rope + KV write", step)
        timed(engine.scheduler, "schedule", lambda *a: "scheduler", step)
        timed(engine.scheduler, "postprocess", lambda *a: "scheduler", step)
        timed(engine.cache, "prepare_step", lambda *a: "block tables", step)
        original_run = engine.runner.run

        def run_step(seqs, query_lens, cache):
            lens.append(list(query_lens))
            return original_run(seqs, query_lens, cache)
        engine.runner.run = run_step
        llm.generate([WARM], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        prompts = prompts_for(Point("", folder, f"04-{precision}", prompt, in_flight, tokens))  # the sweep's
        # walls: the decode-only steps of every request; mixed: (seconds, tokens fed) of the steps that prefilled;
        # fewer: (seconds, rows) of the decode-only steps once some requests have finished
        decode, walls, mixed, fewer, step_of = defaultdict(float), [], [], [], llm.step
        prefill = defaultdict(float)  # the parts of the steps that prefilled, summed

        def counted_step():
            step.clear()
            lens.clear()
            start = time.perf_counter()
            event = step_of()
            wall = time.perf_counter() - start
            fed = lens[0] if lens else []
            if any(n > 1 for n in fed):
                mixed.append((wall, sum(fed)))
                for k, v in step.items():
                    prefill[k] += v
            elif len(fed) < in_flight:
                fewer.append((wall, len(fed)))
            else:
                walls.append(wall)
                for k, v in step.items():
                    decode[k] += v
            return event
        llm.step = counted_step
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    finally:
        invariant.RowTiled.__call__ = call
        attention_native.NativeTable.attention = attend
    tpot = float(np.median([(o.metrics.token_times[-1] - o.metrics.token_times[0]) / (len(o.metrics.token_times) - 1)
                            for o in outs]))
    n = len(walls)
    return {"label": f"{folder}: {precision} linears, {in_flight} x {prompt}-token prompts, {tokens} out; "
                     f"{llm.execution_path}", "in_flight": in_flight, "tpot": tpot, "mixed": mixed, "walls": walls,
            "fewer": fewer, "parts": {k: v / n for k, v in decode.items()} if n else {}, "prefill parts": prefill,
            "tokens": [o.token_ids for o in outs],
            "alone": linears_alone(model, in_flight), "layers": len(model.layers)}


def report(r: dict) -> None:
    tpot, walls, parts, k = r["tpot"], r["walls"], r["parts"], r["in_flight"]
    print(r["label"])
    mixed = ", ".join(f"{1e3 * w:.0f} ms/{t} tok" for w, t in r["mixed"])
    print(f"  sweep's TPOT (median over requests) {1e3 * tpot:.1f} ms (in flight / TPOT {k / tpot:.1f} tok/s); "
          f"{len(r['mixed'])} steps with prompt tokens ({mixed}); {len(r['fewer'])} decode steps of fewer rows")
    if not walls:
        return
    wall = float(np.mean(walls))
    print(f"  decode-only steps of all {k}: {len(walls)}, mean {1e3 * wall:.1f} ms, "
          f"median {1e3 * np.median(walls):.1f} ms = {k / np.median(walls):.1f} tok/s")
    linears = sum(v for name, v in parts.items() if name.startswith("linear"))
    rows = sorted(parts.items(), key=lambda kv: -kv[1]) + [("linears, all", linears),
                                                           ("the rest", wall - sum(parts.values()))]
    for name, v in rows:
        print(f"    {name:22s} {1e3 * v:8.2f} ms a step ({100 * v / wall:4.1f}%)")
    if r["mixed"]:  # the same parts in the steps that prefilled, for comparison
        total, parts = sum(w for w, _ in r["mixed"]), r["prefill parts"]
        shares = sorted(parts.items(), key=lambda kv: -kv[1]) + [("the rest", total - sum(parts.values()))]
        print("  the steps with prompt tokens, share of their time: "
              + ", ".join(f"{name} {100 * v / total:.1f}%" for name, v in shares))
    alone = r["alone"]
    per_step = r["layers"] * sum(v for name, v in alone.items() if name != "lm_head") + alone["lm_head"]
    print("  each linear alone at the step's rows, ms: " + ", ".join(f"{n} {1e3 * v:.2f}" for n, v in alone.items())
          + f"; summed over a step {1e3 * per_step:.1f}")


def linears_alone(model, rows: int, reps: int = 5) -> dict[str, float]:
    """Seconds per call of layer 0's linears (and the LM head) on ``rows`` random rows, called back to back."""
    import torch

    layer, out = model.layers[0], {}
    for name, lin in [(n, layer[n]) for n in ("qkv", "o", "gate_up", "down")] + [("lm_head", model.lm_head)]:
        x = torch.randn(rows, lin.in_features).to(model.dtype)
        lin(x)
        start = time.perf_counter()
        for _ in range(reps):
            lin(x)
        out[name] = (time.perf_counter() - start) / reps
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model folder (stages.bench.make_model's output)")
    ap.add_argument("--precision", default="bf16", help="bf16, int8 or int4, comma-separated (default bf16)")
    ap.add_argument("--in-flight", type=int, default=16, help="requests at once (default 16)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--tokens", type=int, default=32, help="output tokens per request (default 32, as the sweep)")
    args = ap.parse_args(argv)
    for precision in args.precision.split(","):
        if precision not in ("bf16", "int8", "int4"):
            raise SystemExit(f"--precision: {precision!r} is not one of bf16, int8, int4")
        report(run(args.model, precision, args.in_flight, args.prompt, args.tokens))


if __name__ == "__main__":
    main()

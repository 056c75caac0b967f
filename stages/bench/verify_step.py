"""`python -m stages.bench.verify_step`: where stage 06's time goes against stage 05's, on the stage's measurement.

Why: stage 06 on ``edit`` at one request in flight keeps 4-5 tokens a step, yet runs 2.3-3.4x stage 05, not 4-5x.
This runs both stages on the same requests (stage 06's own workload and default policy, 1 in flight) and times each
step by part in this process (perf_counter around the proposers, the scheduler, the cache's addressing, the linears,
attention with RoPE and the KV write, the norms, SwiGLU, the LM head, and "the rest": the embedding, the logits'
float32, verification and sampling, Python between). It prints the share of the wall time the prompts take (the same
in both stages, so a larger share of stage 06's), then stage 06's decoding steps by the rows they fed, grouped by the
AVX-512 linear kernel's passes of 6 rows (``AVX_ROWS``), with the tokens each kept; then the LM head and one layer's
linears alone at 1, 6, 7, 12, 13, 17 and 18 rows (the 10th percentile of alternated calls; the layer's weights stay
in cache, the LM head's come from memory): whether a pass that holds one row costs what a full one does. CPU only;
run it alone (docs/speculative.md quotes it).
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from stages.bench.decode_step import timed

PASS_ROWS = 6  # common/numerics/native/linear_avx512.h: AVX_ROWS
ROWS = (1, 6, 7, 12, 13, 17, 18)


def profile(llm, prompts, params) -> tuple[list, list[dict], float]:
    """Generate, timing each step by part: (the outputs, one dict a step, the wall seconds)."""
    engine, model = llm.engine, llm.engine.model
    parts, steps = defaultdict(float), []
    names = {id(layer[n]) for layer in model.layers for n in ("qkv", "o", "gate_up", "down")}
    from common.numerics.invariant import RowTiled as linear_type  # every linear's class, the LM head's too

    call = linear_type.__call__
    try:
        timed(linear_type, "__call__", lambda lin, x: "linears" if id(lin) in names else "LM head", parts)
        timed(model, "attend", lambda *a: "attention + RoPE", parts)
        timed(model, "add_rms_norm", lambda *a: "norms", parts)
        timed(model, "swiglu", lambda *a: "SwiGLU", parts)
        timed(engine.scheduler, "schedule", lambda *a: "scheduler + proposers", parts)
        timed(engine.scheduler, "postprocess", lambda *a: "scheduler + proposers", parts)
        timed(engine.cache, "prepare_step", lambda *a: "block tables", parts)
        step_of = engine.step

        def counted_step():
            parts.clear()
            start = time.perf_counter()
            result = step_of()
            wall = time.perf_counter() - start
            outs, lens = result.outputs, result.batch.lens
            steps.append({"wall": wall, "rows": sum(lens), "kept": sum(len(o.tokens) for o in outs),
                          "prompt": any(n > 1 + o.drafted for n, o in zip(lens, outs)), **parts})
            return result
        engine.step = counted_step
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        return outs, steps, time.perf_counter() - start
    finally:
        linear_type.__call__ = call
        del engine.step


def report(label: str, steps: list[dict], wall: float, tokens: int) -> None:
    prompt = sum(s["wall"] for s in steps if s["prompt"])
    print(f"{label}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tok/s; steps that fed prompt tokens "
          f"{1e3 * prompt:.0f} ms ({100 * prompt / wall:.0f}% of the wall time)")
    decode = [s for s in steps if not s["prompt"]]
    names = ("linears", "LM head", "attention + RoPE", "norms", "SwiGLU", "scheduler + proposers", "block tables")
    print(f"  {'rows fed':>9s} {'steps':>5s} {'kept':>5s} {'ms/step':>7s} {'ms/token':>8s}  "
          + " ".join(f"{n:>14s}" for n in names) + f" {'the rest':>9s}   (medians, ms)")
    for lo in range(1, max((s["rows"] for s in decode), default=0) + 1, PASS_ROWS):
        group = [s for s in decode if lo <= s["rows"] < lo + PASS_ROWS]
        if not group:
            continue
        med = {n: 1e3 * float(np.median([s.get(n, 0.0) for s in group])) for n in ("wall",) + names}
        kept = float(np.mean([s["kept"] for s in group]))
        rest = 1e3 * float(np.median([s["wall"] - sum(s.get(n, 0.0) for n in names) for s in group]))
        share = sum(s["wall"] for s in group) / wall
        print(f"  {lo:>3d}-{lo + PASS_ROWS - 1:<5d} {len(group):5d} {kept:5.2f} {med['wall']:7.2f} "
              f"{med['wall'] / kept:8.2f}  " + " ".join(f"{med[n]:14.2f}" for n in names)
              + f" {rest:9.2f}   ({100 * share:.0f}% of the wall)")


def rows_alone(model, reps: int = 15) -> dict[int, tuple[float, float]]:
    """rows -> (seconds of layer 0's four linears, of the LM head), each the 10th percentile of ``reps`` alternated
    calls (the row counts taken in turn, forwards then backwards)."""
    import torch

    layer, times = model.layers[0], {r: ([], []) for r in ROWS}
    lins = [layer[n] for n in ("qkv", "o", "gate_up", "down")]
    xs = {r: [torch.randn(r, lin.in_features).to(model.dtype) for lin in lins] for r in ROWS}
    heads = {r: torch.randn(r, model.lm_head.in_features).to(model.dtype) for r in ROWS}
    for rep in range(reps):
        for r in ROWS if rep % 2 == 0 else ROWS[::-1]:
            start = time.perf_counter()
            for lin, x in zip(lins, xs[r]):
                lin(x)
            middle = time.perf_counter()
            model.lm_head(heads[r])
            times[r][0].append(middle - start)
            times[r][1].append(time.perf_counter() - middle)
    return {r: tuple(sorted(t)[len(t) // 10] for t in pair) for r, pair in times.items()}


def main(argv: list[str] | None = None) -> None:
    from stages import speculative, streaming
    from stages.speculative.defaults import STAGE_DEFAULT
    from stages.speculative.measure import kv_budget
    from stages.speculative.workloads import build

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder (default: SmolLM2-135M)")
    ap.add_argument("--workload", default="edit", help="stage 06's workload (default edit)")
    ap.add_argument("--num-requests", type=int, default=8, help="requests, one at a time (default 8, as the stage)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's own; the engines' "
                    "2 on the 2-core machines: 1 keeps a loaded machine's other processes from stalling each call)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        import torch
        torch.set_num_threads(args.threads)
    from common.paths import DEFAULT_MODEL
    args.model, args.dtype = args.model or DEFAULT_MODEL, "bfloat16"
    options = dict(dtype="bfloat16", max_num_seqs=1, kv_cache_memory=kv_budget(args, 1), max_model_len=1024)
    base = streaming.LLM(args.model, **options)
    spec = speculative.LLM(args.model, speculative_config=STAGE_DEFAULT, **options)  # what its command line runs
    for llm in (base, spec):  # one-time costs outside the timing, as the stage's measurement
        llm.generate([[1, 2, 3]], {"temperature": 0, "max_tokens": 2})
    prompts, params = build(args.workload, spec.tokenizer, args.num_requests, args.max_tokens)
    outputs = {}
    for label, llm in (("stage 05", base), ("stage 06", spec)):
        outs, steps, wall = profile(llm, prompts, params)
        outputs[label] = [o.token_ids for o in outs]
        report(label, steps, wall, sum(len(t) for t in outputs[label]))
    print("same tokens:", "yes" if outputs["stage 05"] == outputs["stage 06"] else "NO")
    print("alone, 10th percentile (ms): rows: layer 0's 4 linears / the LM head")
    for r, (linears, head) in rows_alone(spec.engine.model).items():
        print(f"  {r:3d} rows ({-(-r // PASS_ROWS)} pass{'es' if r > PASS_ROWS else ''}): {1e3 * linears:6.3f} / "
              f"{1e3 * head:6.2f}")


if __name__ == "__main__":
    main()

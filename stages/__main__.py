"""python -m stages: the benchmark ladder. One workload through every stage and the baselines, in one process.

Prints a table (metrics down, engines across) with each engine's ratio to stage 01 and to
each baseline, and writes the figures as JSON (--json, default bench-<workload>.json).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import time

import torch
from rich.console import Console
from rich.table import Table

from common import roofline, workloads
from common.cli import STAGE_NAMES, make_llm, parser
from common.loader import expected_shapes
from common.paths import resolve_model, smollm2_gguf_path
from common.report import format_value, summary_row

from . import baselines

ALL_STAGES = list(STAGE_NAMES)


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__)
    ap.set_defaults(num_requests=128, max_tokens=128, max_num_seqs=32)
    ap.add_argument("--stages", default="01,02,03,04,05", help="which stages to run, e.g. 01,03")
    ap.add_argument("--hf-batch-sizes", default="16,32,64", help="left-padded batch sizes HF generate tries")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--prompt-range", default="16,256", help="random workload: prompt lengths")
    ap.add_argument("--json", default=None)
    return ap


def stage_row(module: str, args, prompts, params, bw: float, flops: float) -> dict:
    llm = make_llm(module, args)
    outputs = llm.generate(prompts, params, progress=True)
    if hasattr(llm, "shutdown"):
        llm.shutdown()
    r = summary_row(llm.stats, outputs, llm.max_num_seqs)
    st, weights = llm.stats, llm.model.weight_bytes
    # Bytes a step must read (weights once, plus KV) vs time: bandwidth use; 2 FLOP per weight per token: compute use.
    per_token = llm.config.kv_bytes_per_token(llm.dtype.itemsize)
    kv_read = sum(len(o.prompt_token_ids) + len(o.token_ids) / 2 for o in outputs) * per_token
    params_count = sum(math.prod(shape) for shape in expected_shapes(llm.config).values())
    r["bandwidth use"] = (st.steps * weights + kv_read) / st.wall_seconds / bw
    r["compute use"] = 2 * params_count * (st.prefill_tokens + st.decode_tokens) / st.wall_seconds / flops
    r["tokens"] = [o.token_ids for o in outputs]
    return r


def single_request_decode(llm, prompt: list[int], bw: float, tokens: int = 64) -> dict:
    """Decode speed of one request alone against the ceiling: bandwidth / weight bytes read per step."""
    from common.sampling import SamplingParams
    m = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))[0].metrics
    rate = (len(m.token_times) - 1) / (m.token_times[-1] - m.token_times[0])
    ceiling = bw / llm.model.weight_bytes
    return {"tokens": tokens, "decode tok/s": rate, "ceiling tok/s": ceiling, "of ceiling": rate / ceiling,
            "weight MB": llm.model.weight_bytes / 1e6}


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    console = Console()
    torch.manual_seed(0)
    bw, flops = roofline.measure_bandwidth(args.device), roofline.measure_matmul_flops(args.device,
                                                                                    getattr(torch, args.dtype))
    llm0 = importlib.import_module("common.reference").ReferenceLLM(args.model, dtype=args.dtype, device=args.device,
                                                                    quantization=args.quantization)
    if args.workload == "random":
        lo, hi = map(int, args.prompt_range.split(","))
        prompts, params = workloads.random_lengths(args.num_requests, (lo, hi), (8, args.max_tokens),
                                                   llm0.config.vocab_size)
    else:
        prompts, params = workloads.build(args.workload, llm0.tokenizer, args.num_requests, args.max_tokens,
                                          llm0.config.vocab_size, system=workloads.SYSTEM_PROMPT if args.system_prompt
                                          else None)
    ids = [p if isinstance(p, list) else llm0.tokenizer.encode(p) for p in prompts]
    alone = single_request_decode(llm0, ids[0], bw)
    del llm0
    console.print(f"[bold]ladder:[/] {args.workload}, {len(prompts)} requests, {sum(map(len, ids)):,} prompt tokens, "
                  f"{args.model}, {args.dtype}{f' ({args.quantization} weights)' if args.quantization else ''}, "
                  f"{args.device}, {os.cpu_count()} CPUs, copy bandwidth "
                  f"{bw / 1e9:.1f} GB/s, matmul {flops / 1e9:,.0f} GFLOP/s")
    rows: dict[str, dict] = {}
    for nn in args.stages.split(","):
        module = next(m for m in ALL_STAGES if m.startswith(f"stages.{nn}"))
        rows[STAGE_NAMES[module]] = stage_row(module, args, prompts, params, bw, flops)
        console.print(f"{STAGE_NAMES[module]}: {rows[STAGE_NAMES[module]]['output tok/s']:.1f} output tok/s")
    reference_tokens = next(iter(rows.values()))["tokens"]
    same = {name: r.pop("tokens") == reference_tokens for name, r in rows.items()}
    notes, base = [], {}
    ignore_eos = all(p.ignore_eos for p in params)
    limits = [p.max_tokens for p in params]
    if not args.no_hf and not ignore_eos:
        best = None
        for bs in map(int, args.hf_batch_sizes.split(",")):
            r = baselines.hf_generate(resolve_model(args.model), ids, limits, 2, bs, getattr(torch, args.dtype))
            console.print(f"{r['engine']}: {r['output tok/s']:.1f} output tok/s")
            best = r if best is None or r["output tok/s"] > best["output tok/s"] else best
        base["HF"] = best
    elif ignore_eos:
        notes.append("HF generate skipped: this workload ignores EOS, which generate cannot do per request")
    if not args.no_llama_cpp and baselines.llama_cpp_available() and args.model == "smollm2-135m":
        base["llama.cpp"] = baselines.llama_cpp(smollm2_gguf_path(), ids, limits, os.cpu_count())
        console.print(f"llama.cpp: {base['llama.cpp']['output tok/s']:.1f} output tok/s")
    elif not args.no_llama_cpp:
        notes.append("llama.cpp skipped: llama-cpp-python is not installed (pip install llama-cpp-python; it compiles "
                     "for minutes)")
    first = rows[next(iter(rows))]["output tok/s"]
    for name, r in {**rows, **{b["engine"]: b for b in base.values()}}.items():
        r["x stage 01" if "01 static" in rows else "x first stage"] = r["output tok/s"] / first
        for label, b in base.items():
            r[f"x {label}"] = r["output tok/s"] / b["output tok/s"]
    precision = f"{args.dtype}" + (f", {args.quantization} weights (HF: {args.dtype})" if args.quantization else "")
    table = Table(title=f"{args.workload} workload, {len(prompts)} requests, {precision}, {platform.machine()} CPU "
                  f"x{os.cpu_count()}" if args.device == "cpu" else args.device)
    table.add_column("metric")
    columns = {**rows, **{b["engine"]: b for b in base.values()}}
    for name in columns:
        table.add_column(name, justify="right")
    metrics = [m for m in next(iter(rows.values())) if m != "engine"]
    metrics += [m for b in base.values() for m in b if m not in metrics and m != "engine"]
    for m in metrics:
        table.add_row(m, *(format_value(m, c[m]) if m in c else "-" for c in columns.values()))
    table.add_row("same tokens as first stage", *(("yes" if same[n] else "NO") if n in same else "-" for n in columns))
    console.print(table)
    console.print(f"one request alone (reference, {alone['tokens']} tokens): decode {alone['decode tok/s']:.1f} tok/s = "
                  f"{alone['of ceiling']:.0%} of the bandwidth ceiling ({alone['ceiling tok/s']:.1f} tok/s = "
                  f"{bw / 1e9:.1f} GB/s / {alone['weight MB']:.0f} MB of weights per step)")
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    result = {"workload": args.workload, "requests": len(prompts), "dtype": args.dtype,
              "quantization": args.quantization, "device": args.device,
              "cpus": os.cpu_count(), "bandwidth_bytes_per_s": bw, "matmul_flops": flops, "date": time.strftime("%F"),
              "engines": columns, "same_tokens": same, "single_request": alone, "notes": notes, "argv": argv}
    path = args.json or f"bench-{args.workload}.json"
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    console.print(f"figures written to {path}")
    return result


if __name__ == "__main__":
    main()

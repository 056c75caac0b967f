"""python -m stages: the benchmark ladder. One workload through every stage and the baselines, in one process.

Prints a table (metrics down, engines across) with each engine's ratio to stage 01 and to each
baseline, the same stage on plain (not batch-invariant) math for the price of invariance, one
request alone against HF at batch 1 and against the read-bandwidth ceiling, and a verdict: does
every stage beat the one before it? Beside the stages run their peers (stages/bench/peers.py: vLLM's CPU
backend, llama.cpp batched, HF continuous batching, each at every in-flight limit and for one request
alone), each with a verdict line: stepwise's best stage over that peer. Writes the figures as JSON (--json,
default bench-<workload>.json) and, with --plot FILE.png, a picture. With --rounds R the stages run R times,
interleaved, and each keeps its median run, and one request alone (ours and HF's at batch 1) is timed R
times, its median kept (this VM's speed moves by 10-30% from minute to minute).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from stages import workloads
from stages.bench import roofline
from stages.cli import STAGE_NAMES, parser
from common.prepare import resolve_model
from common.reference import ReferenceLLM
from stages.report import format_value

from . import markdown, peers, verdict
from .runs import hf_single_request, median_run, single_request, stage_row, stage_single_request


def rounds_arg(text: str) -> int:
    try:
        rounds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of rounds") from None
    if rounds < 1:
        raise argparse.ArgumentTypeError(f"{rounds} rounds would run nothing: give 1 or more")
    return rounds


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__)
    ap.set_defaults(num_requests=128, max_tokens=128, max_num_seqs=32)
    ap.add_argument("--stages", default="01,02,03,04,05", help="which stages to run, e.g. 01,03")
    ap.add_argument("--in-flight", default=None, help="several max_num_seqs to run the stages at, e.g. 32,64")
    ap.add_argument("--rounds", type=rounds_arg, default=1,
                    help="run the stages this many times, interleaved, and keep each one's median run "
                         "(and the median of as many single-request runs)")
    ap.add_argument("--no-plain", action="store_true", help="skip stage 03 on plain math (the price of invariance)")
    ap.add_argument("--hf-batch-sizes", default="16,32,64", help="left-padded batch sizes HF generate tries")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    peers.add_arguments(ap)
    ap.add_argument("--prompt-range", default="16,256", help="random workload: prompt lengths")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", action="store_true", help="then print the ladder as a Markdown table (for a README)")
    ap.add_argument("--plot", default=None, help="draw the ladder (tok/s, TTFT, TPOT) into this PNG (matplotlib)")
    return ap


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    console = Console()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    copy_bw, read_bw = roofline.measure_bandwidth(args.device), roofline.measure_read_bandwidth(args.device)
    flops = roofline.measure_matmul_flops(args.device, dtype)
    ref = ReferenceLLM(args.model, dtype=args.dtype, device=args.device, quantization=args.quantization)
    if args.workload == "random":
        lo, hi = map(int, args.prompt_range.split(","))
        prompts, params = workloads.random_lengths(args.num_requests, (lo, hi), (8, args.max_tokens),
                                                   ref.config.vocab_size)
    else:
        prompts, params = workloads.build(args.workload, ref.tokenizer, args.num_requests, args.max_tokens,
                                          ref.config.vocab_size,
                                          system=workloads.SYSTEM_PROMPT if args.system_prompt else None)
    params = workloads.sampled(params, args.temperature, args.top_p)
    ids = [p if isinstance(p, list) else ref.tokenizer.encode(p) for p in prompts]
    work = peers.Workload(args.model, ids, [p.max_tokens for p in params], [] if all(p.ignore_eos for p in params)
                          else list(ref.config.eos_token_ids or [ref.config.eos_token_id]), args.dtype,
                          args.max_num_batched_tokens)
    alone = single_request(ref, ids[0], read_bw, rounds=args.rounds)
    del ref
    console.print(f"[bold]ladder:[/] {args.workload}, {len(prompts)} requests, {sum(map(len, ids)):,} prompt tokens, "
                  f"{args.model}, {args.dtype}{f' ({args.quantization} weights)' if args.quantization else ''}, "
                  f"{args.device}, {os.cpu_count()} CPUs, read bandwidth {read_bw / 1e9:.1f} GB/s (copy "
                  f"{copy_bw / 1e9:.1f}), matmul {flops / 1e9:,.0f} GFLOP/s")
    rows, verdicts, plain_ratio, steps_notes, latency_notes = {}, {}, {}, {}, {}
    stage_runs, peer_runs, notes = {}, {}, []
    running = []  # the peers still to run: one that is not built or fails is dropped after its one note
    for peer in peers.chosen(args):
        if why := peers.why_not(peer, work, args.temperature):
            notes.append(why)
        else:
            running.append(peer)
    in_flight = [int(n) for n in (args.in_flight or str(args.max_num_seqs)).split(",")]
    for n in in_flight:
        suffix = f" @{n}" if len(in_flight) > 1 else ""
        run_args = copy.copy(args)
        run_args.max_num_seqs = n
        runs: dict[str, list[dict]] = {}
        engines = [(STAGE_NAMES[m], m, False) for nn in args.stages.split(",")
                   for m in STAGE_NAMES if m.startswith(f"stages.{nn}")]
        if not args.no_plain and any(m == "stages.03_paged_kv" for _, m, _ in engines):
            engines.append(("03 paged, plain math", "stages.03_paged_kv", True))
        for r in range(args.rounds):  # interleaved, so a slow minute on a shared machine hits every engine alike
            for name, module, plain in engines:
                run_args.no_batch_invariant = plain or args.no_batch_invariant
                runs.setdefault(name, []).append(stage_row(module, run_args, prompts, params, read_bw, flops))
                console.print(f"{name}{suffix}{f' (round {r + 1})' if args.rounds > 1 else ''}: "
                              f"{runs[name][-1]['output tok/s']:.1f} output tok/s")
        ran = stage_runs[n] = {name: median_run(name_runs) for name, name_runs in runs.items()}
        verdicts[n] = verdict.verdict({k: v for k, v in ran.items() if "plain" not in k})
        steps_notes[n] = verdict.steps_against_rows(ran)
        latency_notes[n] = (verdict.latency_verdict(ran), verdict.describe_step_cost(ran))
        if "03 paged, plain math" in ran:
            plain_ratio[n] = ran["03 paged"]["output tok/s"] / ran["03 paged, plain math"]["output tok/s"]
        rows.update({name + suffix: r for name, r in ran.items()})
        if at := peers.run_at(running, work, n, notes, console):  # each alone on the machine, after the stages
            peer_runs[n] = at
    first_tokens = next(iter(rows.values()))["tokens"]
    # None: an engine's rounds disagreed among themselves, which can never count as the same tokens
    same = {name: (tokens := r.pop("tokens")) is not None and tokens == first_tokens for name, r in rows.items()}
    peer_columns = {peers.PEERS[p] + (f" @{n}" if len(in_flight) > 1 else ""): r for n, at in peer_runs.items()
                    for p, r in at.items()}
    notes += [f"{name}: {peers.agreement(r.pop('tokens'), first_tokens)}" for name, r in peer_columns.items()
              if "tokens" in r and first_tokens is not None]
    base, base_notes = peers.run_baselines(args, ids, params, work.eos, console)
    notes += base_notes
    first = next(iter(rows.values()))["output tok/s"]
    columns = {**rows, **peer_columns, **{b["engine"]: b for b in base.values()}}
    for r in columns.values():
        r["x stage 01" if "01 static" in rows else "x first column"] = r["output tok/s"] / first
        for label, b in base.items():
            r[f"x {label}"] = r["output tok/s"] / b["output tok/s"]
    precision = f"{args.dtype}" + (f", {args.quantization} weights (HF: {args.dtype})" if args.quantization else "")
    table = Table(title=f"{args.workload} workload, {len(prompts)} requests, {precision}, {platform.machine()} CPU "
                  f"x{os.cpu_count()}" if args.device == "cpu" else args.device)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    metrics = [m for m in next(iter(rows.values())) if m != "engine"]
    metrics += [m for b in [*peer_columns.values(), *base.values()] for m in b if m not in metrics and m != "engine"]
    for m in metrics:
        table.add_row(m, *(format_value(m, c[m]) if m in c else "-" for c in columns.values()))
    table.add_row("same tokens as first stage", *(("yes" if same[n] else "NO") if n in same else "-" for n in columns))
    console.print(table)
    best = verdict.best_stage(stage_runs[in_flight[-1]])
    if best:  # one request alone through the best stage at the last in-flight limit, and through each peer
        module = next(m for m, name in STAGE_NAMES.items() if name == best[0])
        best = alone["best stage"] = (best[0], stage_single_request(module, args, ids[0], read_bw,
                                                                    args.rounds)["decode tok/s"])
    others = peers.run_alone(running, work, alone["tokens"], args.rounds, notes)
    if not args.no_hf:
        alone["HF batch 1 decode tok/s"] = others["hf-generate"] = hf_single_request(
            resolve_model(args.model), ids[0], dtype, alone["tokens"], args.rounds)
    alone["peers decode tok/s"] = others
    print_alone(console, alone, read_bw, args)
    peer_verdicts = verdict.peer_verdicts(stage_runs, peer_runs, best, others, peers.PEERS, peers.ALONE)
    for n, ratio in plain_ratio.items():
        console.print(f"price of invariance at {n} in flight: stage 03 on invariant math runs at {ratio:.2f}x its "
                      f"plain-math speed (python -m stages.bench.invariance shows what plain math changes)")
    for n, (ok, text) in verdicts.items():
        console.print(f"[{'green' if ok else 'red'}]verdict at {n} in flight:[/] {text}")
    for v in peer_verdicts:
        console.print(f"[bold]peer verdict:[/] {v['text']}")
    for n, text in steps_notes.items():
        if text:
            console.print(f"steps against rows at {n} in flight: {text}")
    for n, texts in latency_notes.items():
        for label, text in zip(("latency", "step cost"), texts):
            if text:
                console.print(f"{label} at {n} in flight: {text}")
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    result = {"model": args.model, "workload": args.workload, "requests": len(prompts), "dtype": args.dtype,
              "quantization": args.quantization, "device": args.device, "cpus": os.cpu_count(),
              "read_bandwidth_bytes_per_s": read_bw, "copy_bandwidth_bytes_per_s": copy_bw, "matmul_flops": flops,
              "date": time.strftime("%F"), "engines": columns, "same_tokens": same, "single_request": alone,
              "invariant_over_plain": plain_ratio, "verdicts": {n: v for n, (_, v) in verdicts.items()},
              "peers": list(peer_columns), "peer_verdicts": peer_verdicts,
              "steps_against_rows": steps_notes, "latency": latency_notes,
              "climbs": all(ok for ok, _ in verdicts.values()), "notes": notes, "argv": argv}
    path = args.json or f"bench-{args.workload}.json"
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    console.print(f"figures written to {path}")
    if args.markdown:
        print(markdown.ladder_table(result, columns, same, " ".join(argv or sys.argv[1:])))
    if args.plot:
        verdict.plot(columns, args.plot, f"{args.workload}, {len(prompts)} requests, {args.model}, {precision}, "
                                         f"{platform.machine()} x{os.cpu_count()}", tuple(peer_columns))
        console.print(f"ladder drawn in {args.plot}")
    return result


def print_alone(console, alone: dict, read_bw: float, args) -> None:
    runs_note = f", median of {args.rounds} runs: {alone['rounds decode tok/s']}" if args.rounds > 1 else ""
    console.print(f"one request alone ({alone['tokens']} tokens{runs_note}): "
                  f"decode {alone['decode tok/s']:.1f} tok/s = "
                  f"{alone['of ceiling']:.0%} of the read-bandwidth ceiling ({alone['ceiling tok/s']:.1f} tok/s = "
                  f"{read_bw / 1e9:.1f} GB/s / {alone['weight MB']:.0f} MB of weights per token)"
                  + (f"; HF generate at batch 1: {alone['HF batch 1 decode tok/s']:.1f} tok/s, so "
                     f"{alone['decode tok/s'] / alone['HF batch 1 decode tok/s']:.2f}x" if not args.no_hf else ""))
    if "best stage" in alone:
        name, rate = alone["best stage"]
        console.print(f"one request alone through {name} (one slot): decode {rate:.1f} tok/s" + "".join(
            f"; {peers.ALONE[p]}: {r:.1f}" for p, r in alone["peers decode tok/s"].items()))

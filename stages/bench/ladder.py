"""python -m stages: the benchmark ladder. One workload through every stage and the baselines, in one process.

Prints a table (metrics down, engines across) with each engine's ratio to stage 01 and to each baseline, the
same stage on plain (not batch-invariant) math for the price of invariance, one request alone against HF at
batch 1 and against the read-bandwidth ceiling, and a verdict: does every stage beat the one before it? Beside
the stages run their peers (stages/bench/peers.py: vLLM's CPU backend, llama.cpp batched, HF continuous
batching, each at every in-flight limit and for one request alone), each with a verdict line: stepwise's best
stage over that peer. Writes the figures as JSON (--json, default bench-<workload>.json) and, with --plot
FILE.png, a picture. With --rounds R the stages run R times, interleaved (every other round in reverse order),
and each keeps its median run, and one request alone (ours and HF's at batch 1) is timed R times, its median
kept (a shared machine's speed moves from minute to minute: docs/ladder-runs.md).
"""
from __future__ import annotations

import argparse
import copy
import os
import time
from dataclasses import dataclass, field

import torch
from rich.console import Console

from stages import workloads
from stages.bench import machine
from stages.cli import STAGE_NAMES, parser
from common.prepare import resolve_model
from common.reference import ReferenceLLM
from stages.report import describe_step_cost

from . import ladder_report, peers, verdict
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
    ap.add_argument("--stages", default="01,02,03,04,05,06,07", help="which stages to run, e.g. 01,03")
    ap.add_argument("--in-flight", default=None, help="several max_num_seqs to run the stages at, e.g. 32,64")
    ap.add_argument("--rounds", type=rounds_arg, default=1,
                    help="run the stages this many times, interleaved (every other round in reverse order), and "
                         "keep each one's median run "
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


@dataclass
class Ladder:
    """One ladder run: its settings, workload and machine, and the figures each phase of `main` adds in turn."""
    args: argparse.Namespace
    prompts: list
    params: list
    ids: list[list[int]]  # the prompts as token ids, what every engine and peer is given
    work: peers.Workload
    machine: dict  # "copy" and "read" bandwidth (bytes/s), "flops" (`machine.measure_compute`, FLOP/s)
    alone: dict  # one request alone: the reference's figures, then the best stage's and the peers'
    in_flight: list[int]
    stage_runs: dict = field(default_factory=dict)  # in-flight limit -> stage -> its (median) row
    peer_runs: dict = field(default_factory=dict)  # in-flight limit -> peer -> its row
    baselines: dict = field(default_factory=dict)  # label -> row
    running: list = field(default_factory=list)  # the peers still to run: one that fails is dropped after its note
    notes: list = field(default_factory=list)


def main(argv=None) -> dict:
    """Measure the machine and the workload, run the stages, peers and baselines, judge, report."""
    args = build_parser().parse_args(argv)
    console = Console()
    lad = measure(args, console)
    run_in_flight(lad, console)
    lad.baselines, base_notes = peers.run_baselines(args, lad.ids, lad.params, lad.work.eos, console)
    lad.notes += base_notes
    columns, same, peer_columns = judge_columns(lad)
    ladder_report.print_table(console, lad, columns, same)
    best, others = run_alone(lad, console)
    result, verdicts = judge(lad, columns, same, peer_columns, best, others)
    result["argv"] = argv
    ladder_report.report(console, lad, result, verdicts, argv)
    return result


def measure(args: argparse.Namespace, console: Console) -> Ladder:
    """The machine (bandwidths, matmul rate), the workload as token ids, and one request alone through the
    reference (the ceiling each stage is held against)."""
    torch.manual_seed(0)
    copy_bw, read_bw = machine.measure_bandwidth(args.device), machine.measure_read_bandwidth(args.device)
    flops, which = machine.measure_compute(args.device, getattr(torch, args.dtype))
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
                  f"{copy_bw / 1e9:.1f}), matmul {flops / 1e9:,.0f} GFLOP/s{which}")
    in_flight = [int(n) for n in (args.in_flight or str(args.max_num_seqs)).split(",")]
    return Ladder(args, prompts, params, ids, work, {"copy": copy_bw, "read": read_bw, "flops": flops}, alone,
                  in_flight)


def run_in_flight(lad: Ladder, console: Console) -> None:
    """At each in-flight limit, the stages (``--rounds`` times, interleaved, each keeping its median run), then
    each peer alone on the machine."""
    args = lad.args
    for peer in peers.chosen(args):
        if why := peers.why_not(peer, lad.work, args.temperature):
            lad.notes.append(why)
        else:
            lad.running.append(peer)
    engines = [(STAGE_NAMES[m], m, False) for nn in args.stages.split(",")
               for m in STAGE_NAMES if m.startswith(f"stages.{nn}")]
    if not args.no_plain and any(m == "stages.03_paged_kv" for _, m, _ in engines):
        engines.append(("03 paged, plain math", "stages.03_paged_kv", True))
    for n in lad.in_flight:
        suffix = f" @{n}" if len(lad.in_flight) > 1 else ""
        run_args = copy.copy(args)
        run_args.max_num_seqs = n
        runs: dict[str, list[dict]] = {}
        for r in range(args.rounds):  # interleaved, so a slow minute on a shared machine hits every engine alike;
            # every other round backwards, so a machine that speeds up (or slows) run after run favours no end
            for name, module, plain in (engines if r % 2 == 0 else engines[::-1]):
                run_args.no_batch_invariant = plain or args.no_batch_invariant
                runs.setdefault(name, []).append(stage_row(module, run_args, lad.prompts, lad.params,
                                                           lad.machine["read"], lad.machine["flops"]))
                console.print(f"{name}{suffix}{f' (round {r + 1})' if args.rounds > 1 else ''}: "
                              f"{runs[name][-1]['output tok/s']:.1f} output tok/s")
        lad.stage_runs[n] = {name: median_run(name_runs) for name, name_runs in runs.items()}
        if at := peers.run_at(lad.running, lad.work, n, lad.notes, console):  # each alone, after the stages
            lad.peer_runs[n] = at


def run_alone(lad: Ladder, console: Console) -> tuple[tuple[str, float] | None, dict]:
    """One request alone through the best stage at the last in-flight limit, each peer and HF at batch 1: the
    best stage and its decode tok/s (None if no stage ran), and the others' decode tok/s."""
    args, alone = lad.args, lad.alone
    best = verdict.best_stage(lad.stage_runs[lad.in_flight[-1]])
    if best:
        module = next(m for m, name in STAGE_NAMES.items() if name == best[0])
        best = alone["best stage"] = (best[0], stage_single_request(module, args, lad.ids[0], lad.machine["read"],
                                                                    args.rounds)["decode tok/s"])
    others = peers.run_alone(lad.running, lad.work, alone["tokens"], args.rounds, lad.notes)
    if not args.no_hf:
        alone["HF batch 1 decode tok/s"] = others["hf-generate"] = hf_single_request(
            resolve_model(args.model), lad.ids[0], getattr(torch, args.dtype), alone["tokens"], args.rounds)
    alone["peers decode tok/s"] = others
    return best, others


def judge_columns(lad: Ladder) -> tuple[dict, dict, dict]:
    """Every engine's row as a column of the table, with its ratio to stage 01 and to each baseline; whether each
    stage gave the first stage's tokens (a peer's agreement with them goes to the notes); the peers' columns."""
    multi = len(lad.in_flight) > 1
    rows = {name + (f" @{n}" if multi else ""): r for n, ran in lad.stage_runs.items() for name, r in ran.items()}
    first_tokens = next(iter(rows.values()))["tokens"]
    # None: an engine's rounds disagreed among themselves, which can never count as the same tokens
    same = {name: (tokens := r.pop("tokens")) is not None and tokens == first_tokens for name, r in rows.items()}
    peer_columns = {peers.PEERS[p] + (f" @{n}" if multi else ""): r for n, at in lad.peer_runs.items()
                    for p, r in at.items()}
    lad.notes += [f"{name}: {peers.agreement(r.pop('tokens'), first_tokens)}" for name, r in peer_columns.items()
                  if "tokens" in r and first_tokens is not None]
    first = next(iter(rows.values()))["output tok/s"]
    columns = {**rows, **peer_columns, **{b["engine"]: b for b in lad.baselines.values()}}
    for r in columns.values():
        r["x stage 01" if "01 static" in rows else "x first column"] = r["output tok/s"] / first
        for label, b in lad.baselines.items():
            r[f"x {label}"] = r["output tok/s"] / b["output tok/s"]
    return columns, same, peer_columns


def judge(lad: Ladder, columns: dict, same: dict, peer_columns: dict, best, others: dict) -> tuple[dict, dict]:
    """The run's verdicts (does each stage beat the one before, and stepwise's best stage each peer), the price of
    invariance and the notes on steps and latency: every figure, as the JSON the ladder writes, and the verdicts
    with whether each holds (in-flight limit -> (ok, text))."""
    args, m = lad.args, lad.machine
    verdicts, plain_ratio, steps_notes, latency_notes = {}, {}, {}, {}
    for n, ran in lad.stage_runs.items():
        verdicts[n] = verdict.verdict({k: v for k, v in ran.items() if "plain" not in k})
        steps_notes[n] = verdict.steps_against_rows(ran)
        latency_notes[n] = (verdict.latency_verdict(ran), describe_step_cost(ran))
        if "03 paged, plain math" in ran:
            plain_ratio[n] = ran["03 paged"]["output tok/s"] / ran["03 paged, plain math"]["output tok/s"]
    peer_verdicts = verdict.peer_verdicts(lad.stage_runs, lad.peer_runs, best, others, peers.PEERS, peers.ALONE)
    return {"model": args.model, "workload": args.workload, "requests": len(lad.prompts), "dtype": args.dtype,
            "quantization": args.quantization, "device": args.device, "cpus": os.cpu_count(),
            "read_bandwidth_bytes_per_s": m["read"], "copy_bandwidth_bytes_per_s": m["copy"],
            "matmul_flops": m["flops"], "date": time.strftime("%F"), "engines": columns, "same_tokens": same,
            "single_request": lad.alone, "invariant_over_plain": plain_ratio,
            "verdicts": {n: v for n, (_, v) in verdicts.items()}, "peers": list(peer_columns),
            "peer_verdicts": peer_verdicts, "steps_against_rows": steps_notes, "latency": latency_notes,
            "climbs": all(ok for ok, _ in verdicts.values()), "notes": lad.notes}, verdicts

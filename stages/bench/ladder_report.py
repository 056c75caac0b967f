"""What the ladder prints and writes: its table, one request alone, the verdicts and notes, the JSON, and on
request the Markdown table and the picture."""
from __future__ import annotations

import json
import os
import platform
import sys

from rich.console import Console
from rich.table import Table

from stages.report import format_value

from . import markdown, peers, verdict


def precision(args) -> str:
    return f"{args.dtype}" + (f", {args.quantization} weights (HF: {args.dtype})" if args.quantization else "")


def print_table(console: Console, lad, columns: dict, same: dict) -> None:
    """Metrics down, engines across: the stages, the peers, the baselines; "-" where an engine has no such figure."""
    args = lad.args
    table = Table(title=f"{args.workload} workload, {len(lad.prompts)} requests, {precision(args)}, "
                  f"{platform.machine()} CPU x{os.cpu_count()}" if args.device == "cpu" else args.device)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    stage_rows = [r for ran in lad.stage_runs.values() for r in ran.values()]
    hidden = ("engine", "rounds")  # the name heads its column; "rounds tok/s" shows the rounds
    metrics = [m for m in stage_rows[0] if m not in hidden]
    others = [r for at in lad.peer_runs.values() for r in at.values()] + list(lad.baselines.values())
    metrics += [m for b in others for m in b if m not in metrics and m not in hidden]
    for m in metrics:
        table.add_row(m, *(format_value(m, c[m]) if m in c else "-" for c in columns.values()))
    table.add_row("same tokens as first stage", *(("yes" if same[n] else "NO") if n in same else "-" for n in columns))
    console.print(table)


def report(console: Console, lad, result: dict, verdicts: dict, argv) -> None:
    """One request alone, the verdicts, the notes; the JSON (--json); the Markdown table and the plot if asked."""
    args = lad.args
    print_alone(console, lad.alone, lad.machine["read"], args)
    for n, ratio in result["invariant_over_plain"].items():
        console.print(f"price of invariance at {n} in flight: stage 03 on invariant math runs at {ratio:.2f}x its "
                      f"plain-math speed (python -m stages.bench.invariance shows what plain math changes)")
    for n, (ok, text) in verdicts.items():
        console.print(f"[{'green' if ok else 'red'}]verdict at {n} in flight:[/] {text}")
    for v in result["peer_verdicts"]:
        console.print(f"[bold]peer verdict:[/] {v['text']}")
    for n, text in result["steps_against_rows"].items():
        if text:
            console.print(f"steps against rows at {n} in flight: {text}")
    for n, texts in result["latency"].items():
        for label, text in zip(("latency", "step cost"), texts):
            if text:
                console.print(f"{label} at {n} in flight: {text}")
    for note in result["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    path = args.json or f"bench-{args.workload}.json"
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    console.print(f"figures written to {path}")
    columns, same = result["engines"], result["same_tokens"]
    if args.markdown:
        print(markdown.ladder_table(result, columns, same, " ".join(argv or sys.argv[1:])))
    if args.plot:
        verdict.plot(columns, args.plot, f"{args.workload}, {len(lad.prompts)} requests, {args.model}, "
                                         f"{precision(args)}, {platform.machine()} x{os.cpu_count()}",
                     tuple(result["peers"]))
        console.print(f"ladder drawn in {args.plot}")


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
        console.print(f"one request alone through {name} (one slot): decode {rate:.1f} tok/s = "
                      f"{rate / alone['ceiling tok/s']:.0%} of the ceiling" + "".join(
            f"; {peers.ALONE[p]}: {r:.1f}" for p, r in alone["peers decode tok/s"].items()))

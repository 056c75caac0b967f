"""The edge lesson, measured: for each precision, the bytes one token reads, the time they imply, the time taken.

    python -m stages.bench.edge [--model smollm2-135m] [--tokens 64] [--rounds 3] [--no-llama-cpp]
                               [--side-by-side 12] [--precisions int8,int4] [--gguf FILE]
    python -m stages.bench.edge --model ~/.cache/stepwise/scale-models/llama-3.2-3b --precisions int8,int4 \
        --gguf ~/.cache/stepwise/scale-models/llama-3.2-3b/model-q4_1.gguf --tokens 32 --side-by-side 0

Each precision runs in a fresh process, so its peak resident memory at load is its own
(the checkpoint is memory-mapped: only the tensors a precision uses are ever read). Per
precision: the weight bytes one decode step reads, the per-token time they imply at the
measured read bandwidth, the per-token time measured (one request alone, greedy, EOS
ignored; the reference, then stage 04 with its fused CPU kernels), time to first token for a
short chat prompt and a 512-token one, and memory. Then where stage 04's token goes: its linears,
timed call by call (the projections' calls fitted as ``a fixed cost per call + bytes / bandwidth``:
the cost per call does not shrink with the bytes, which is why fewer bits per weight gain less
than their ratio), and the rest of the step.
llama.cpp (llama-cpp-python, if installed) runs the GGUF itself the same way, same threads.
These are timings: run them on a quiet machine. With ``--rounds R`` every precision (and llama.cpp) runs
R times, interleaved, so a slow minute hits them alike; the table shows each figure's median, and the
speed ratios the targets are about (int8 against bfloat16, int4 against llama.cpp) are taken round by
round, side by side, and printed with every round's value. Then (``--side-by-side TURNS``) one more process
holds stage 04 in all three precisions and decodes the same request with each in turn, the order rotating:
those ratios divide times taken about a second apart, where a round's fresh processes are up to a minute apart
on a machine whose speed drifts by tens of percent from one minute to the next.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from common.paths import DEFAULT_MODEL
from stages.bench import children
from stages.bench.machine import measure_read_bandwidth
from stages.bench.roofline import edge_figures
from stages.bench.edge_measure import (measure_llama_cpp, measure_side_by_side, measure_stepwise, precisions,
                                       side_by_side_ratios)

TARGET_MS = 100.0  # the lesson's latency target: a token, and the first one, within 100 ms


def in_fresh_process(args: list[str]) -> dict:
    run = children.run([sys.executable, "-m", "stages.bench.edge", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"stages.bench.edge {' '.join(args)} failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def measure(model: str = DEFAULT_MODEL, tokens: int = 64, llama_cpp: bool = True,
            rounds: int = 1, only: list[str] | None = None, gguf: str | None = None) -> tuple[float, dict, list[dict]]:
    """Read bandwidth, each precision's figures (medians over ``rounds`` interleaved runs) and every round's rows.
    ``only``: the precisions to run (bfloat16, int8, int4, w4a8); ``gguf``: llama.cpp's file for a model other
    than SmolLM2 (the 3B scale shape's model-q4_1.gguf, for the article's edge variant)."""
    bandwidth = measure_read_bandwidth()
    children = {("bfloat16" if q == "none" else q): ["--child", q, "--model", model, "--tokens", str(tokens)]
                for q in precisions() if only is None or ("bfloat16" if q == "none" else q) in only}
    if llama_cpp and (model == DEFAULT_MODEL or gguf):
        try:
            import llama_cpp  # noqa: F401
            children["llama.cpp Q4_1"] = ["--child", "llama.cpp", "--tokens", str(tokens)] + (
                ["--gguf", gguf] if gguf else [])
        except ImportError:
            pass
    by_round = [{name: in_fresh_process(args) for name, args in children.items()} for _ in range(rounds)]
    rows = {name: {figure: float(np.median([r[name][figure] for r in by_round])) for figure in by_round[0][name]}
            for name in children}
    for row in rows.values():
        row["estimated ms per token"] = 1e3 * row["weight MB"] * 1e6 / bandwidth
        row["measured / estimated"] = row["ms per token"] / row["estimated ms per token"]
    return bandwidth, rows, by_round


def speed_ratios(by_round: list[dict]) -> dict[str, list[float]]:
    """Decode-rate ratios per round (each a quotient of two times measured in the same round): int8, int4 and w4a8
    against bfloat16, on the reference's path and through stage 04, and int4 and w4a8 against llama.cpp (whose
    Q4_1 x Q8_1 is w4a8's kind of arithmetic)."""
    pairs = {"int8 / bfloat16": ("int8", "bfloat16"), "int4 / bfloat16": ("int4", "bfloat16"),
             "w4a8 / bfloat16": ("w4a8", "bfloat16"), "int4 / llama.cpp": ("int4", "llama.cpp Q4_1"),
             "w4a8 / llama.cpp": ("w4a8", "llama.cpp Q4_1")}
    ratios = {}
    for label, (fast, base) in pairs.items():
        if base not in by_round[0] or fast not in by_round[0]:
            continue
        for path, figure in (("reference", "ms per token"), ("stage 04", "ms per token, stage 04")):
            base_figure = "ms per token" if base == "llama.cpp Q4_1" else figure
            ratios[f"{label}, {path}"] = [r[base][base_figure] / r[fast][figure] for r in by_round]
    return ratios


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved runs of every precision (medians)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--side-by-side", type=int, default=12, metavar="TURNS",
                    help="then every precision's stage 04 in one process, in this many turns (0: skip)")
    ap.add_argument("--precisions", default=None, help="comma-separated: bfloat16,int8,int4,w4a8 (default: all)")
    ap.add_argument("--gguf", default=None, help="llama.cpp's GGUF for --model (e.g. a scale shape's model-q4_1.gguf)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "side-by-side":
        times = measure_side_by_side(args.model, args.tokens, args.side_by_side)
        print(json.dumps(times))
        return times
    if args.child:
        threads = torch.get_num_threads()
        row = (measure_llama_cpp(args.tokens, threads, args.gguf) if args.child == "llama.cpp" else
               measure_stepwise(args.model, None if args.child == "none" else args.child, args.tokens))
        print(json.dumps(row))
        return row
    only = args.precisions.split(",") if args.precisions else None
    bandwidth, rows, by_round = measure(args.model, args.tokens, not args.no_llama_cpp, args.rounds, only, args.gguf)
    order = ["weight MB", "estimated ms per token", "ms per token", "ms per token, stage 04", "measured / estimated",
             "linears ms per token, stage 04", "rest of the step ms, stage 04", "projections GB/s (fit)",
             "µs per projection call besides bytes (fit)"]
    figures = order + [k for k in next(iter(rows.values())) if k not in order]
    medians = f", medians of {args.rounds} interleaved rounds" if args.rounds > 1 else ""
    table = Table(title=f"{args.model}, one request alone, {torch.get_num_threads()} threads{medians}: read bandwidth "
                        f"{bandwidth / 1e9:.1f} GB/s; target {TARGET_MS:.0f} ms per token and to the first token")
    table.add_column("figure")
    for name in rows:
        table.add_column(name, justify="right")
    for figure in figures:
        digits = 2 if figure == "measured / estimated" else 0 if figure == "linear calls per token" else 1
        table.add_row(figure, *(f"{rows[n][figure]:,.{digits}f}" if figure in rows[n] else "-" for n in rows))
    console = Console()
    console.print(table)
    article = edge_figures()  # the article's illustration: 3B parameters at 100 GB/s
    console.print(f"the article (illustrative): a 3B model at 100 GB/s reads {article['weights GB (8-bit)']:.0f} GB "
                  f"(int8) in {article['ms per token (8-bit)']:.0f} ms, {article['weights GB (4-bit)']:.1f} GB (int4) "
                  f"in {article['ms per token (4-bit)']:.0f} ms per token; here, measured: weight MB / "
                  f"{bandwidth / 1e9:.1f} GB/s is the 'estimated' row, 'ms per token' what it took")
    ratios = speed_ratios(by_round)
    for label, values in ratios.items():  # each round's ratio is of two times taken minutes apart at most
        rounds = f" (rounds {' / '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else ""
        console.print(f"decode speed {label}: {float(np.median(values)):.2f}x{rounds}")
    side = {}
    if args.side_by_side > 0:  # minutes apart at most above; here a second apart, many times over
        times = in_fresh_process(["--child", "side-by-side", "--model", args.model, "--tokens", str(args.tokens),
                                  "--side-by-side", str(args.side_by_side)])
        side = side_by_side_ratios(times)
        for q in [q for q in ("int8", "int4", "w4a8") if f"{q} / bfloat16, stage 04" in side]:
            values = side[f"{q} / bfloat16, stage 04"]
            low, mid, high = np.percentile(values, [25, 50, 75])
            console.print(f"decode speed {q} / bfloat16, stage 04, side by side in one process: {mid:.2f}x (quartiles "
                          f"{low:.2f}-{high:.2f} over {len(values)} turns; ms per token "
                          f"{np.median(times['bfloat16']):.1f} / {np.median(times[q]):.1f})")
    return {"read bandwidth GB/s": bandwidth / 1e9, "rows": rows, "speed ratios": ratios, "side by side": side}


if __name__ == "__main__":
    main()

"""The command line every stage shares: `python -m stages.NN_name [--toy] [--workload ...]`."""
from __future__ import annotations

import argparse
import importlib

from rich.console import Console

from common import workloads
from common.report import print_timeline, summary_row, summary_table

STAGE_NAMES = {"stages.01_static_batch": "01 static", "stages.02_continuous_batch": "02 continuous"}


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="smollm2-135m", help="checkpoint folder, 'smollm2-135m' or 'tiny'")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="batch size (slots)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--workload", default="chat", choices=["chat", "random", "toy"])
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--toy", action="store_true", help="the 8-request toy run, stages side by side")
    ap.add_argument("--compare", action="store_true", help="run this stage and the previous one side by side")
    ap.add_argument("--timeline", action="store_true", help="draw the slot timeline even for long runs")
    return ap


def run(stage_modules: list[str], args: argparse.Namespace, console: Console | None = None) -> dict:
    console = console or Console()
    if args.toy:
        args.workload, args.max_num_seqs = "toy", 4
        if args.model == "smollm2-135m":
            args.model = "tiny"  # the toy run is about steps, not text
    rows, timelines = {}, {}
    for module in stage_modules:
        llm = importlib.import_module(module).LLM(args.model, dtype=args.dtype, device=args.device,
                                                  max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
        prompts, params = workloads.build(args.workload, llm.tokenizer, args.num_requests, args.max_tokens,
                                          llm.config.vocab_size)
        outputs = llm.generate(prompts, params, progress=True)
        name = STAGE_NAMES.get(module, module)
        rows[name] = summary_row(llm.stats, outputs)
        timelines[name] = llm.timeline
        if args.workload == "chat" and len(stage_modules) == 1:
            for o in outputs[:2]:
                console.print(f"[bold green]{o.text[:200]!r}[/] ({o.finish_reason})")
    for name, steps in timelines.items():
        if args.timeline or len(steps) <= 300:
            print_timeline(console, name, steps)
    title = (f"{args.workload} workload: {len(prompts)} requests, {args.max_num_seqs} slots, "
             f"{args.model}, {args.dtype}")
    console.print(summary_table(rows, title))
    if len(rows) == 2:
        (a, ra), (b, rb) = rows.items()
        console.print(f"{b} vs {a}: {ra['steps'] / rb['steps']:.2f}x fewer steps, "
                      f"{rb['output tok/s'] / ra['output tok/s']:.2f}x output tokens/s")
    return rows

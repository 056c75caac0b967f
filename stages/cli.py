"""The command line every stage shares: `python -m stages.NN_name [--toy] [--workload ...]`."""
from __future__ import annotations

import argparse
import importlib
from dataclasses import replace

from rich.console import Console

from common.paths import DEFAULT_MODEL
from stages import workloads
from common.loader import parse_memory, resolve_device
from common.validate import InvalidParam
from stages.report import describe_step_cost, print_blocks, print_timeline, summary_row, summary_table
from stages.xray import cli as xray

STAGE_NAMES = {"stages.01_static_batch": "01 static", "stages.02_continuous_batch": "02 continuous",
               "stages.03_paged_kv": "03 paged", "stages.04_kernels": "04 kernels",
               "stages.05_streaming": "05 streaming", "stages.06_speculative": "06 speculative",
               "stages.07_structured": "07 structured"}


def device_arg(text: str) -> str:
    """--device: 'auto' becomes the device it picks (CUDA when torch sees a GPU), so commands see a real one."""
    return str(resolve_device(text))


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"checkpoint folder, {DEFAULT_MODEL!r} or 'tiny'")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--quantization", default=None, choices=["int8", "int4", "w4a8"],
                    help="weight quantization (common/numerics/quant.py; w4a8 also rounds activations to int8); "
                         "computes in bfloat16")
    ap.add_argument("--device", default="auto", type=device_arg, help="cpu, cuda, or auto (CUDA when torch sees a GPU)")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="most requests in flight (slots)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--workload", default="chat", choices=["chat", "random", "toy", "nano-vllm"],
                    help="nano-vllm: its benchmark (256 random-token requests, lengths 100-1,024, temperature 0.6)")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--system-prompt", action="store_true", help="chat prompts share a long system prompt")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample every request at this temperature, each with its own seed (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling")
    ap.add_argument("--n", type=int, default=1, help="samples per request (SamplingParams.n); from stage 03 on "
                    "they share the prompt's KV blocks")
    ap.add_argument("--separate", action="store_true", help="with --n: send each request's samples as requests of "
                    "their own (sample i with seed + i: the same tokens, nothing forked)")
    ap.add_argument("--kv-memory", default=None,
                    help="KV budget ('192MiB', '2GB', bytes, or a fraction of free memory); stages 01-02 get "
                         "as many max_model_len slots as it holds")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block (stage 03 on)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per step (stage 03 on)")
    ap.add_argument("--no-prefix-caching", action="store_true", help="stage 03 on: recompute shared prompts")
    ap.add_argument("--no-chunked-prefill", action="store_true", help="stage 03 on: a prompt waits for a step that "
                    "holds all of it")
    ap.add_argument("--no-preemption", action="store_true", help="stage 03 on: reserve every block a request may "
                    "need when it is admitted")
    ap.add_argument("--no-batch-invariant", action="store_true",
                    help="plain torch math (faster; a request's tokens then depend on its batch)")
    ap.add_argument("--toy", action="store_true", help="the 8-request toy run, stages side by side")
    ap.add_argument("--compare", action="store_true", help="run this stage and the previous one side by side")
    ap.add_argument("--timeline", action="store_true", help="draw the slot timeline even for long runs")
    xray.add_arguments(ap)
    return ap


def make_llm(module: str, args: argparse.Namespace):
    """Build a stage's LLM from the shared command line; the same KV budget becomes blocks (stage 03 on) or whole
    slots (01-02). A stage's ``command_line_defaults`` fill the options the command line leaves unset."""
    cls = importlib.import_module(module).LLM
    given = vars(args)
    kw = dict(dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              batch_invariant=not args.no_batch_invariant, quantization=given.get("quantization"),
              kv_cache_memory=parse_memory(args.kv_memory, resolve_device(args.device)), block_size=args.block_size,
              max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=not args.no_prefix_caching,
              enable_chunked_prefill=not args.no_chunked_prefill, enable_preemption=not args.no_preemption)
    kw.update({key: given.get(key) or default for key, default in cls.command_line_defaults.items()})
    try:
        return cls(args.model, **kw)
    except InvalidParam as e:  # a budget that holds no slot, say: the reason, not a traceback
        raise SystemExit(f"{STAGE_NAMES.get(module, module)}: {e}") from None


def run(stage_modules: list[str], args: argparse.Namespace, console: Console | None = None) -> dict:
    console = console or Console()
    if args.toy:
        args.workload, args.max_num_seqs = "toy", 4
        if args.model == DEFAULT_MODEL:
            args.model = "tiny"  # the toy run is about steps, not text
    rows, timelines, blocks = {}, {}, {}
    recorder = xray.recorder(args, {"model": args.model, "workload": args.workload, "kv_memory": args.kv_memory})
    for module in stage_modules:
        llm = make_llm(module, args)
        system = workloads.SYSTEM_PROMPT if args.system_prompt else None
        prompts, params = workloads.build(args.workload, llm.tokenizer, args.num_requests, args.max_tokens,
                                          llm.config.vocab_size, system=system)
        params = workloads.sampled(params, args.temperature, args.top_p)
        if args.n > 1 and args.separate:
            prompts = [p for p in prompts for _ in range(args.n)]
            params = [q.for_sample(i) for q in (replace(p, n=args.n) for p in params) for i in range(args.n)]
        elif args.n > 1:
            params = [replace(p, n=args.n) for p in params]
        name = STAGE_NAMES.get(module, module)
        if recorder is not None:
            llm.add_observer(recorder)
            recorder.begin_run(name, {"requests": len(prompts), "max_num_seqs": llm.max_num_seqs})
        outputs = llm.generate(prompts, params, progress=True)
        if recorder is not None:
            recorder.end_run(write=False)
        failed = [o for o in outputs if o.finish_reason == "error"]
        if failed and len(failed) == len(outputs):  # nothing ran: a table of zeros would only hide the reason
            raise SystemExit(f"{name}: every request failed: {failed[0].error}")
        if failed:
            console.print(f"[bold red]{name}: {len(failed)} of {len(outputs)} requests failed[/]: {failed[0].error}")
        rows[name] = summary_row(llm.stats, outputs, llm.max_num_seqs)
        timelines[name] = list(llm.stats.timeline)
        if llm.stats.peak_blocks and args.n > 1:
            console.print(f"{name}: at most {llm.stats.peak_blocks:,} KV blocks held at once; the same sequences' "
                          f"block tables listed {llm.stats.peak_table_blocks:,} at their peak (held with nothing "
                          f"shared)")
        if llm.stats.block_timeline:
            blocks[name] = (list(llm.stats.block_timeline), llm.engine.scheduler.block_manager.num_blocks)
        if args.workload == "chat" and len(stage_modules) == 1:
            for o in outputs[:2]:
                console.print(f"[bold green]{o.text[:200]!r}[/] ({o.finish_reason}{': ' + o.error if o.error else ''})")
    for name, steps in timelines.items():
        if args.timeline or len(steps) <= 300:
            print_timeline(console, name, steps)
    for name, (used, total) in blocks.items():
        print_blocks(console, name, used, total)
    title = (f"{args.workload} workload: {len(prompts)} requests, {args.model}, {args.dtype}"
             + (f" ({args.quantization} weights)" if getattr(args, "quantization", None) else "")
             + (f", KV budget {args.kv_memory}" if args.kv_memory else ""))
    console.print(summary_table(rows, title))
    if recorder is not None:
        xray.write_outputs(recorder, args, console)
    if len(rows) >= 2:
        (a, ra), (b, rb) = list(rows.items())[-2:]
        console.print(f"{b} vs {a}: {ra['steps'] / rb['steps']:.2f}x fewer steps, "
                      f"{rb['output tok/s'] / ra['output tok/s']:.2f}x output tokens/s, TTFT p99 "
                      f"{ra['TTFT p99 s']:.2f} -> {rb['TTFT p99 s']:.2f} s, slot utilization "
                      f"{ra['slot util']:.1%} -> {rb['slot util']:.1%}")
        if (model := describe_step_cost(rows)) is not None:
            console.print(model)
    return rows

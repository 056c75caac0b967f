"""python -m stages.06_speculative [--workload edit,extract,chat] [--in-flight 1,8,64] [--speculative-config JSON]
python -m stages.06_speculative --draft-layers 4,8,16,30 [--workload ...] [--draft-always]
python -m stages.06_speculative serve [--speculative-config JSON] [--host H] [--port P] [--api-key K]

The first: stage 05 and stage 06 on the same requests, side by side, at each in-flight limit: output tokens per
second, the speedup, the acceptance rate (and by draft position), tokens per decoding step, the proposer's share of
the step time, and where speculation stops paying. With --draft-layers: the early-exit table instead (the int4
draft's first N layers and head, for each N, at 1 in flight). The edit workload sends each request's original text
as its prediction (OpenAI's predicted outputs); the others draft with the configured method.
serve: the OpenAI-compatible server of stage 05 over stage 06's engine; chat completions accept ``prediction``."""
import argparse
import json
import os

from rich.console import Console

from common.paths import DEFAULT_MODEL
from common.validate import InvalidParam
from stages.cli import device_arg
from stages.xray import cli as xray

from common.speculative_config import SpeculativeConfig
from stages.speculative.defaults import DRAFT_ALWAYS, STAGE_DEFAULT
from stages.speculative.workloads import WORKLOADS


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers separated by commas, e.g. 1,8,64") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every in-flight limit must be >= 1")
    return values


def workload_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in WORKLOADS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {bad}: use {', '.join(WORKLOADS)}")
    return names


def speculative_config(text: str) -> dict:
    try:
        SpeculativeConfig.parse(text)
    except InvalidParam as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="compare", choices=["compare", "serve"])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--quantization", default=None, choices=["int8", "int4", "w4a8"])
    ap.add_argument("--device", default="auto", type=device_arg)
    ap.add_argument("--speculative-config", type=speculative_config, default=None,
                    help=f"vLLM's keys as JSON (default {json.dumps(STAGE_DEFAULT)}: drafts fed where the adaptive "
                         f"policy finds they pay); method 'draft_model' drafts with the int4 copy of the model, "
                         f"'suffix' from suffix trees of this and earlier requests")
    ap.add_argument("--draft-always", action="store_true",
                    help=f"compare: feed every draft at every size ({json.dumps(DRAFT_ALWAYS)}): the crossover")
    ap.add_argument("--workload", dest="workloads", type=workload_list, default=list(WORKLOADS),
                    help="compare: edit (with predictions), extract (n-gram), chat (where drafts seldom match), "
                         "agentic (one file edited turn after turn)")
    ap.add_argument("--methods", default="ngram,ngram-8,suffix",
                    help="compare: also tokens per step by drafting method at 1 in flight ('' for none)")
    ap.add_argument("--draft-layers", type=int_list, default=None,
                    help="compare: instead, the early-exit table: the int4 draft cut to its first N layers and its "
                         "head, for each N (e.g. 4,8,16,30), at 1 in flight beside stage 05")
    ap.add_argument("--in-flight", type=int_list, default=[1, 8, 64], help="compare: max_num_seqs values")
    ap.add_argument("--rounds", type=int, default=1,
                    help="compare: take each cell N times, stage 05 and stage 06 back to back, alternating which "
                         "goes first; the table prints each cell's median ratio and the rounds' range (rounds.py)")
    ap.add_argument("--json", metavar="FILE.json", default=None,
                    help="compare: write every run's figures there (every round, each cell's median and range)")
    ap.add_argument("--num-requests", type=int, default=8, help="compare: requests per run (at least the limit)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=16, help="serve: running requests")
    ap.add_argument("--kv-memory", default=None, help="serve: KV budget ('256MiB', bytes, or a fraction)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--api-key", default=os.environ.get("STEPWISE_API_KEY"))
    xray.add_arguments(ap)  # compare: stage 06's runs, one per workload and in-flight limit
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1 (got {args.rounds}): each cell's two runs are taken that many times")
    if args.speculative_config is None:
        always = args.command == "compare" and args.draft_always
        args.speculative_config = json.dumps(DRAFT_ALWAYS if always else STAGE_DEFAULT)
    try:
        run(args)
    except InvalidParam as e:
        raise SystemExit(f"error: {e}") from None


def run(args: argparse.Namespace) -> None:
    console = Console()
    if not console.is_terminal:  # a log or a pipe: the comparison table is wider than rich's 80 columns
        console = Console(width=150)
    if args.command == "serve":
        from stages.speculative.engine import LLM
        from stages.speculative.measure import describe
        from stages.streaming.server.shutdown import serve  # stage 05's server
        llm = LLM(args.model, dtype=args.dtype, device=args.device, quantization=args.quantization,
                  max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, kv_cache_memory=args.kv_memory,
                  speculative_config=args.speculative_config)
        console.print(f"[bold]engine:[/] {describe(llm)}")
        try:
            serve(llm, args.host, args.port, args.served_model_name or args.model, api_key=args.api_key)
        finally:
            llm.shutdown()
        return
    from stages.speculative import method_table
    if args.draft_layers:
        method_table.depth_report(method_table.depth_rows(args, args.draft_layers), args, console)
        return
    from stages.speculative.measure import measure, report
    recorder = xray.recorder(args, {"model": args.model, "speculative_config": str(args.speculative_config)})
    report(measure(args, console, recorder), args, console)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if any(m not in method_table.METHODS for m in methods):
        raise SystemExit(f"error: --methods {args.methods!r}: use {', '.join(method_table.METHODS)}")
    if methods:
        method_table.report(method_table.method_rows(args, methods), console)
    if recorder is not None:
        xray.write_outputs(recorder, args, console)


if __name__ == "__main__":
    main()

"""python -m stages.bench.load [--request-rate R] [--max-concurrency N] [--goodput ttft:MS tpot:MS] [--url U]
[--aiperf] [engine options]

A serving benchmark in `vllm bench serve`'s terms (TTFT, TPOT, ITL, E2EL, throughputs, goodput) against stage 05's
server started in its own process with the engine options given (or the one at --url), requests all at once or
Poisson at --request-rate, at most --max-concurrency (--clients) in flight; --aiperf runs NVIDIA's aiperf after
it, side by side."""
import argparse
import contextlib
import importlib

from rich.console import Console

from common.validate import InvalidParam

from .aiperf import check_aiperf, compare_with_aiperf
from .args import add_load_arguments, settings_from
from .client import load_url, serving

options = importlib.import_module("stages.streaming.options")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    options.add_engine_arguments(ap)
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per answer")
    add_load_arguments(ap)
    args = ap.parse_args(argv)
    try:
        run_load(args, Console())
    except InvalidParam as e:  # a bad argument: the reason, not a traceback
        raise SystemExit(f"error: {e}") from None


def run_load(args: argparse.Namespace, console: Console) -> None:
    """`load` against --url or a server of its own; with --aiperf, then aiperf against a fresh server of the same
    settings (a server `load` just ran holds its prompts in the prefix cache: the second tool would prefill
    less), or against --url again, warned."""
    settings = settings_from(args)
    if args.aiperf:
        try:
            check_aiperf(args.aiperf)  # before the run it would follow
        except FileNotFoundError as e:
            raise SystemExit(f"error: {e}") from None
    serve_args = options.serve_arguments(args)
    with contextlib.nullcontext(args.url) if args.url else serving(serve_args) as url:
        figures, records = load_url(url, settings, console)
    if not args.aiperf:
        return
    if args.url:
        console.print("[yellow]aiperf loads the same --url server: its prefix cache holds the prompts load sent[/]")
    try:
        with contextlib.nullcontext(args.url) if args.url else serving(serve_args) as url:
            compare_with_aiperf(url, settings, figures, records, args.aiperf, args.model, console)
    except (OSError, RuntimeError) as e:  # load's figures stand; say why aiperf's are missing
        raise SystemExit(f"error: aiperf: {e}") from None


if __name__ == "__main__":
    main()

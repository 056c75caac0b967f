"""`load`'s command-line options, named as `vllm bench serve` names them, each checked as it is read."""
from __future__ import annotations

import argparse
import math

from common.validate import InvalidParam

from .client import LoadSettings

SLO_METRICS = ("ttft", "tpot", "e2el")
AIPERF = ".venv-aiperf/bin/aiperf"  # where `make aiperf` installs it


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not positive")
    return n


def request_rate(text: str) -> float:
    """Requests per second, > 0; ``inf`` sends them all at once."""
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of requests per second (or inf)") from None
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a request rate is positive (inf: all at once)")
    return rate


def goodput_pair(pair: str) -> tuple[str, float]:
    """``ttft:500`` -> ``("ttft", 500.0)``: an SLO in milliseconds on one of vLLM's request-level metrics."""
    name, sep, value = pair.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{pair!r}: give METRIC:MILLISECONDS, e.g. ttft:500")
    if name not in SLO_METRICS:
        raise argparse.ArgumentTypeError(f"{pair!r}: {name!r} is not one of {', '.join(SLO_METRICS)}")
    try:
        ms = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{pair!r}: {value!r} is not a number of milliseconds") from None
    if not 0 <= ms < math.inf:
        raise argparse.ArgumentTypeError(f"{pair!r}: an SLO is a finite, non-negative number of milliseconds")
    return name, ms


def percentiles(text: str) -> tuple[float, ...]:
    """``50,90,99`` -> ``(50.0, 90.0, 99.0)``, each in (0, 100]."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give percentiles separated by commas, e.g. 50,90,99") from None
    if not all(0 < p <= 100 for p in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each percentile is in (0, 100]")
    return values


def add_load_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("load (vllm bench serve's options and figures)")
    g.add_argument("--num-requests", type=positive_int, default=64, help="requests in all")
    g.add_argument("--request-rate", type=request_rate, default=math.inf,
                   help="Poisson arrivals at this many requests/s; inf (the default) sends them all at once")
    g.add_argument("--max-concurrency", type=positive_int, default=None,
                   help="at most this many requests in flight (default: 16 at rate inf, no cap otherwise)")
    g.add_argument("--clients", type=positive_int, default=None,
                   help="N closed-loop clients: the same as --max-concurrency N at rate inf")
    g.add_argument("--seed", type=int, default=0, help="seeds the Poisson arrivals")
    g.add_argument("--ignore-eos", action="store_true", help="every answer runs to --max-tokens")
    g.add_argument("--goodput", nargs="+", type=goodput_pair, default=[], metavar="METRIC:MS",
                   help="SLOs (ttft, tpot, e2el in ms): goodput counts the requests that meet them all")
    g.add_argument("--metric-percentiles", type=percentiles, default=(99.0,),
                   help="percentiles to report besides mean and median, e.g. 50,90,99 (default 99)")
    g.add_argument("--url", default=None, help="a running server to load (default: start one here)")
    g.add_argument("--aiperf", nargs="?", const=AIPERF, default=None, metavar="AIPERF",
                   help=f"then run NVIDIA's aiperf (default {AIPERF}, `make aiperf`) with the same settings "
                        "against a fresh server of the same settings, and print both tools' figures side by side")


def settings_from(args: argparse.Namespace) -> LoadSettings:
    """The run `load`'s options ask for; ``--clients`` and ``--max-concurrency`` are one setting."""
    if args.clients is not None and args.max_concurrency is not None and args.clients != args.max_concurrency:
        raise InvalidParam("max_concurrency", f"--clients {args.clients} and --max-concurrency {args.max_concurrency}"
                                              " are one setting under two names: give one")
    cap = args.max_concurrency or args.clients or (16 if math.isinf(args.request_rate) else None)
    return LoadSettings(model=args.served_model_name or args.model, num_requests=args.num_requests,
                        max_tokens=args.max_tokens, max_concurrency=cap, request_rate=args.request_rate,
                        seed=args.seed, ignore_eos=args.ignore_eos, api_key=args.api_key,
                        percentiles=args.metric_percentiles, goodput=dict(args.goodput))

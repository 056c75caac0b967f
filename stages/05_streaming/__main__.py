"""python -m stages.05_streaming [demo | serve --host H --port P [--api-key K] |
load [--request-rate R] [--max-concurrency N] [--goodput ttft:MS tpot:MS] [--url U] [--aiperf] |
cluster --replicas N (or --min-replicas A --max-replicas B) [--address RAY]]

demo: chat requests streaming side by side; serve: the OpenAI-compatible server;
load: a serving benchmark in `vllm bench serve`'s terms (TTFT, TPOT, ITL, E2EL, throughputs, goodput) against a
server started in its own process (or the one at --url), requests all at once or Poisson at --request-rate, at
most --max-concurrency (--clients) in flight; --aiperf runs NVIDIA's aiperf after it, side by side;
cluster: the same server in front of engine replicas on Ray Serve (needs the extra: pip install -e '.[cluster]')."""
import argparse
import contextlib
import os

from rich.console import Console

from stages.cli import device_arg
from common.validate import InvalidParam

from .engine import LLM
from .server.guards import DEFAULT_MAX_BODY_BYTES
from .server.load_args import add_load_arguments, settings_from


def port_arg(text: str) -> int:
    """--port: a TCP port, 0-65535 (0: any free port; uvicorn does not check, and 81100 listened elsewhere)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port: use 0-65535")
    return port


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("command", nargs="?", default="demo", choices=["demo", "serve", "load", "cluster"])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--served-model-name", default=None, help="the name clients pass as 'model'")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: float32 for the demo (SmolLM2's first answers in bfloat16 sit on near-ties: "
                         "'What is the capital of France?' starts 'L'Étoile...'), bfloat16 to serve")
    ap.add_argument("--quantization", default=None, choices=["int8", "int4"], help="weight-only quantization")
    ap.add_argument("--device", default="auto", type=device_arg, help="cpu, cuda, or auto (CUDA when torch sees a GPU)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=port_arg, default=8000)
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="running requests per engine (default 16; cluster: calibrated from --tpot-target-ms)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--kv-memory", default=None, help="KV budget: '256MiB', bytes, or a fraction of free memory")
    ap.add_argument("--max-waiting", type=int, default=256, help="queue length past which requests get 503")
    ap.add_argument("--shutdown-timeout", type=float, default=5.0,
                    help="serve: seconds requests in flight get to finish after SIGTERM/SIGINT before they are aborted")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="serve: largest request body")
    ap.add_argument("--api-key", default=os.environ.get("STEPWISE_API_KEY"),
                    help="serve: require 'Authorization: Bearer KEY' on /v1/* (default: $STEPWISE_API_KEY)")
    ap.add_argument("--allowed-origins", default="",
                    help="serve: comma-separated web origins allowed to call the server (CORS); none by default")
    ap.add_argument("--docs", action="store_true", help="serve: expose /docs and /openapi.json")
    ap.add_argument("--max-tokens", type=int, default=96, help="demo and load: tokens per answer")
    add_load_arguments(ap)
    cluster = ap.add_argument_group("cluster (Ray Serve)")
    cluster.add_argument("--address", default=None,
                         help="an existing Ray cluster (HEAD_IP:6379, or 'auto' on one of its nodes); default: "
                              "start Ray on this machine, bound to loopback")
    cluster.add_argument("--replicas", type=int, default=1, help="a fixed number of engine replicas")
    cluster.add_argument("--min-replicas", type=int, default=None, help="autoscale from this many replicas...")
    cluster.add_argument("--max-replicas", type=int, default=None, help="...up to this many")
    cluster.add_argument("--target-ongoing-requests", type=float, default=None,
                         help="autoscaling aims at this many requests per replica (default: its max_num_seqs)")
    cluster.add_argument("--tpot-target-ms", type=float, default=100.0,
                         help="per-token latency target: each replica's max_num_seqs is the largest batch that "
                              "meets it, measured at start-up (unless --max-num-seqs is given)")
    cluster.add_argument("--torch-threads", type=int, default=1, help="torch threads per replica")
    cluster.add_argument("--cpus-per-replica", type=float, default=1.0, help="Ray CPUs each replica reserves")
    cluster.add_argument("--upscale-delay-s", type=float, default=5.0, help="sustained load before adding a replica")
    cluster.add_argument("--downscale-delay-s", type=float, default=30.0, help="idle time before removing one")
    args = ap.parse_args(argv)
    try:
        run(args)
    except InvalidParam as e:  # a bad argument or a request that cannot run: the reason, not a traceback
        raise SystemExit(f"error: {e}") from None


def run(args: argparse.Namespace) -> None:
    console = Console()
    args.dtype = args.dtype or ("float32" if args.command == "demo" else "bfloat16")
    if args.command == "cluster":
        from .cluster.deploy import run_cluster
        return run_cluster(args, console)
    if args.command == "load":
        return run_load(args, console)
    args.max_num_seqs = args.max_num_seqs or 16
    llm = LLM(args.model, dtype=args.dtype, device=args.device, quantization=args.quantization,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, kv_cache_memory=args.kv_memory,
              max_waiting=args.max_waiting)
    console.print(f"[bold]engine:[/] stage 05 on {llm.execution_path}, {args.dtype}")
    try:
        if args.command == "serve":
            from .server.shutdown import serve
            origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
            serve(llm, args.host, args.port, args.served_model_name or args.model,
                  shutdown_timeout=args.shutdown_timeout, api_key=args.api_key, docs=args.docs,
                  allowed_origins=origins, max_body_bytes=args.max_body_bytes)
        else:
            from .demo import run_demo
            run_demo(llm, args.max_tokens, console)
    finally:
        llm.shutdown()


def run_load(args: argparse.Namespace, console: Console) -> None:
    """`load` against --url or a server of its own; with --aiperf, then aiperf against a fresh server of the same
    settings (a server `load` just ran holds its prompts in the prefix cache: the second tool would prefill
    less), or against --url again, warned."""
    from .server.aiperf import check_aiperf, compare_with_aiperf
    from .server.load import load_url, serving
    settings = settings_from(args)
    if args.aiperf:
        try:
            check_aiperf(args.aiperf)  # before the run it would follow
        except FileNotFoundError as e:
            raise SystemExit(f"error: {e}") from None
    with contextlib.nullcontext(args.url) if args.url else serving(serve_arguments(args)) as url:
        figures, records = load_url(url, settings, console)
    if not args.aiperf:
        return
    if args.url:
        console.print("[yellow]aiperf loads the same --url server: its prefix cache holds the prompts load sent[/]")
    try:
        with contextlib.nullcontext(args.url) if args.url else serving(serve_arguments(args)) as url:
            compare_with_aiperf(url, settings, figures, records, args.aiperf, args.model, console)
    except (OSError, RuntimeError) as e:  # load's figures stand; say why aiperf's are missing
        raise SystemExit(f"error: aiperf: {e}") from None


def serve_arguments(args: argparse.Namespace) -> list[str]:
    """The `serve` options a load run starts its server with: the engine's, as given to `load`."""
    out = ["--model", args.model, "--dtype", args.dtype, "--device", args.device,
           "--max-num-seqs", str(args.max_num_seqs or 16), "--max-waiting", str(args.max_waiting)]
    for flag, value in (("--quantization", args.quantization), ("--max-model-len", args.max_model_len),
                        ("--kv-memory", args.kv_memory), ("--served-model-name", args.served_model_name)):
        if value is not None:
            out += [flag, str(value)]
    return out


if __name__ == "__main__":
    main()

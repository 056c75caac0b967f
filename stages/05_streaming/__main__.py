"""python -m stages.05_streaming [demo | serve --host H --port P [--api-key K] |
cluster --replicas N (or --min-replicas A --max-replicas B) [--address RAY]]

demo: chat requests streaming side by side; serve: the OpenAI-compatible server;
cluster: the same server in front of engine replicas on Ray Serve (needs the extra: pip install -e '.[cluster]').
The load benchmark against a server (vLLM's `bench serve` figures, aiperf beside it) is an instrument:
python -m stages.bench.load."""
import argparse

from rich.console import Console

from common.validate import InvalidParam
from stages.xray import cli as xray

from stages.streaming.engine import LLM
from stages.streaming.options import add_engine_arguments
from stages.streaming.server.guards import DEFAULT_MAX_BODY_BYTES


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
    ap.add_argument("command", nargs="?", default="demo", choices=["demo", "serve", "cluster"])
    add_engine_arguments(ap)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=port_arg, default=8000)
    ap.add_argument("--shutdown-timeout", type=float, default=5.0,
                    help="serve: seconds requests in flight get to finish after SIGTERM/SIGINT before they are aborted")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="serve: largest request body")
    ap.add_argument("--allowed-origins", default="",
                    help="serve: comma-separated web origins allowed to call the server (CORS); none by default")
    ap.add_argument("--docs", action="store_true", help="serve: expose /docs and /openapi.json")
    ap.add_argument("--max-tokens", type=int, default=96, help="demo: tokens per answer")
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
        from stages.streaming.cluster.deploy import run_cluster
        return run_cluster(args, console)
    args.max_num_seqs = args.max_num_seqs or 16
    llm = LLM(args.model, dtype=args.dtype, device=args.device, quantization=args.quantization,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, kv_cache_memory=args.kv_memory,
              max_waiting=args.max_waiting, max_num_batched_tokens=args.max_num_batched_tokens)
    console.print(f"[bold]engine:[/] stage 05 on {llm.execution_path}, {args.dtype}")
    recorder = xray.recorder(args, {"model": args.model, "workload": args.command, "kv_memory": args.kv_memory},
                             label=f"05 streaming ({args.command})",
                             window=args.xray_window if args.command == "serve" else None)
    if recorder is not None:  # --trace/--xray/--chrome-trace: written when the demo ends, or the server stops
        llm.add_observer(recorder)
    try:
        if args.command == "serve":
            from stages.streaming.server.shutdown import serve
            origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
            serve(llm, args.host, args.port, args.served_model_name or args.model,
                  shutdown_timeout=args.shutdown_timeout, api_key=args.api_key, docs=args.docs,
                  allowed_origins=origins, max_body_bytes=args.max_body_bytes, xray=not args.no_xray)
        else:
            from stages.streaming.demo import run_demo
            run_demo(llm, args.max_tokens, console)
    finally:
        llm.shutdown()
        if recorder is not None:
            xray.write_outputs(recorder, args, console)


if __name__ == "__main__":
    main()

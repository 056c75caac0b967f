"""The engine options of stage 05's commands, in one place: `serve`, `demo` and `cluster` read them, and the load
benchmark (`python -m stages.bench.load`) hands them to the `serve` it starts."""
import argparse
import os

from common.paths import DEFAULT_MODEL
from stages.cli import device_arg
from stages.xray import cli as xray


def add_engine_arguments(ap: argparse.ArgumentParser) -> None:
    """The model, its precision and device, and the engine's limits; ``--dtype`` stays None when not given (each
    command picks its own default)."""
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--served-model-name", default=None, help="the name clients pass as 'model'")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: float32 for the demo (SmolLM2's first answers in bfloat16 sit on near-ties: "
                         "'What is the capital of France?' starts 'L'Étoile...'), bfloat16 to serve")
    ap.add_argument("--quantization", default=None, choices=["int8", "int4", "w4a8"],
                    help="weight quantization (w4a8 also rounds activations to int8)")
    ap.add_argument("--device", default="auto", type=device_arg, help="cpu, cuda, or auto (CUDA when torch sees a GPU)")
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="running requests per engine (default 16; cluster: calibrated from --tpot-target-ms)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="tokens one step feeds, prompt chunks and decodes together (vLLM's CPU server: 2048)")
    ap.add_argument("--kv-memory", default=None, help="KV budget: '256MiB', bytes, or a fraction of free memory")
    ap.add_argument("--max-waiting", type=int, default=256, help="queue length past which requests get 503")
    ap.add_argument("--api-key", default=os.environ.get("STEPWISE_API_KEY"),
                    help="serve: require 'Authorization: Bearer KEY' on /v1/* (default: $STEPWISE_API_KEY)")
    ap.add_argument("--no-xray", action="store_true", help="serve: no live X-ray page at /xray")
    xray.add_arguments(ap)  # demo: written when it ends; serve (and the load benchmark's server): at shutdown


def serve_arguments(args: argparse.Namespace) -> list[str]:
    """The `serve` options that start a server with the engine options in ``args`` (the load benchmark's)."""
    out = ["--model", args.model, "--dtype", args.dtype or "bfloat16", "--device", args.device,
           "--max-num-seqs", str(args.max_num_seqs or 16), "--max-waiting", str(args.max_waiting)]
    for flag, value in (("--quantization", args.quantization), ("--max-model-len", args.max_model_len),
                        ("--max-num-batched-tokens", args.max_num_batched_tokens),
                        ("--kv-memory", args.kv_memory), ("--served-model-name", args.served_model_name),
                        ("--trace", args.trace), ("--xray", args.xray), ("--chrome-trace", args.chrome_trace)):
        if value is not None:
            out += [flag, str(value)]
    return out + ["--no-xray"] * args.no_xray

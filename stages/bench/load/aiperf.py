"""NVIDIA's aiperf told what `load` sent, against a server of the same settings; both tools' figures side by side.

aiperf is a third-party load tool (its own venv: `make aiperf`; no torch), so its figures check `load`'s
instrument, not only the server. It is given what `load` sent: the same questions in the same order (a
`single_turn` input file, read sequentially), the same max tokens, greedy, ``ignore_eos`` when `load` set
it, the same concurrency cap or Poisson rate and seed, streaming, the served model's name, and the
checkpoint's own tokenizer folder. Token counts are the server's (``--use-server-token-count``), as vLLM
and `load` count them; by default aiperf re-tokenizes the streamed text instead, which drops the EOS token
the engine generated and does not always give back the ids it decoded from. Its names for vLLM's figures:
TTFT ``time_to_first_token``, TPOT ``inter_token_latency``, ITL ``inter_chunk_latency``, E2EL
``request_latency``. docs/serving-benchmark.md says where the two disagree and why.

aiperf 0.13.0 loads a local tokenizer folder only while ``HF_HUB_OFFLINE`` is unset (set, it looks the path
up as a hub repository id and fails); unset, it reads a local path from disk and asks the hub nothing.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import children
from .client import LoadSettings
from .metrics import LATENCIES, calculate_metrics
from .proc_cpu import CpuSampler

AIPERF_NAMES = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "itl": "inter_chunk_latency",
                "e2el": "request_latency"}
AIPERF_SLOS = {m: AIPERF_NAMES[m] for m in ("ttft", "tpot", "e2el")}  # --goodput takes the request-level ones
COUNTS = ("completed", "failed", "total_input_tokens", "total_output_tokens")


def write_inputs(path: Path, s: LoadSettings) -> None:
    """The requests `load` sends, one JSON line each, in its order: the question and its max tokens."""
    path.write_text("".join(json.dumps({"text": q, "output_length": s.max_tokens}) + "\n" for q in s.prompts()))


def aiperf_command(aiperf: str, url: str, s: LoadSettings, tokenizer: str, inputs: Path, out: Path) -> list[str]:
    """The `aiperf profile` command line that sends what `load` with settings ``s`` sent."""
    cmd = [aiperf, "profile", "--model", s.model, "--url", url, "--endpoint-type", "chat", "--streaming",
           "--input-file", str(inputs), "--custom-dataset-type", "single_turn",
           "--dataset-sampling-strategy", "sequential", "--request-count", str(s.num_requests),
           "--warmup-request-count", "1", "--tokenizer", tokenizer, "--use-server-token-count",
           "--extra-inputs", "temperature:0", *(["--extra-inputs", "ignore_eos:true"] if s.ignore_eos else []),
           "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(out)]
    if math.isinf(s.request_rate):  # all at once, or at most the cap in flight: aiperf's concurrency mode
        cmd += ["--concurrency", str(s.max_concurrency or s.num_requests)]
    else:
        cmd += ["--request-rate", f"{s.request_rate:g}", "--arrival-pattern", "poisson", "--random-seed", str(s.seed)]
        cmd += ["--concurrency", str(s.max_concurrency)] if s.max_concurrency else []
    if s.goodput:
        cmd += ["--goodput", " ".join(f"{AIPERF_SLOS[m]}:{ms:g}" for m, ms in s.goodput.items())]
    if s.api_key:
        cmd += ["--api-key", s.api_key]
    return cmd


def from_aiperf(export: dict, percentiles: tuple[float, ...]) -> dict:
    """aiperf's summary export (profile_export_aiperf.json) under `metrics`' names; what it lacks is None."""
    def stat(tag: str, key: str = "avg"):
        return export.get(tag, {}).get(key)

    ok = stat("request_count") or 0
    out = {"completed": int(ok), "failed": int(stat("error_request_count") or 0),
           "duration": stat("benchmark_duration"), "total_input_tokens": stat("total_isl"),
           "total_output_tokens": stat("total_osl"), "request_throughput": stat("request_throughput"),
           "output_throughput": stat("output_token_throughput"),
           "total_token_throughput": stat("total_token_throughput"), "request_goodput": stat("goodput")}
    for name, tag in AIPERF_NAMES.items():
        out[f"mean_{name}_ms"], out[f"median_{name}_ms"] = stat(tag), stat(tag, "p50")
        for p in percentiles:
            out[f"p{p:g}_{name}_ms"] = stat(tag, f"p{p:g}")
    return out


def check_aiperf(aiperf: str) -> None:
    if not os.access(aiperf, os.X_OK):
        raise FileNotFoundError(f"no aiperf at {aiperf}: `make aiperf` installs it in .venv-aiperf")


def profiling_window(records_file: Path) -> tuple[int, int]:
    """The timed phase's first request sent and last answer ended (wall clock, ns) from aiperf's per-request
    export (profile_export.jsonl): the warm-up phase is left out."""
    spans = [(m["request_start_ns"], m["request_end_ns"]) for m in
             (json.loads(line)["metadata"] for line in records_file.read_text().splitlines())
             if m["benchmark_phase"] == "profiling"]
    return min(a for a, _ in spans), max(b for _, b in spans)


def run_aiperf(aiperf: str, url: str, s: LoadSettings, tokenizer: str, console: Console) -> dict:
    """Run aiperf once (its artifacts in a fresh temporary folder) and read its figures, with the CPU time its
    processes took while its timed requests ran."""
    check_aiperf(aiperf)
    work = Path(tempfile.mkdtemp(prefix="stepwise-aiperf-"))
    write_inputs(work / "inputs.jsonl", s)
    cmd = aiperf_command(aiperf, url, s, tokenizer, work / "inputs.jsonl", work / "artifacts")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    console.print(f"[bold]aiperf:[/] {' '.join(cmd)}")
    with open(work / "aiperf.log", "w") as log:
        with children.session(cmd, stdout=log, stderr=subprocess.STDOUT,
                              env=env | {"HF_HUB_DISABLE_TELEMETRY": "1"}) as proc:  # every aiperf process ends
            sampler = CpuSampler(proc.pid)
            sampler.start()
            try:
                proc.wait()
            finally:
                sampler.stop()
    if proc.returncode != 0:
        tail = (work / "aiperf.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"aiperf exited with code {proc.returncode} (log: {work / 'aiperf.log'}):\n{tail}")
    console.print(f"aiperf's artifacts: {work / 'artifacts'}")
    figures = from_aiperf(json.loads((work / "artifacts" / "profile_export_aiperf.json").read_text()), s.percentiles)
    return figures | {"client_cpu_s": sampler.between(*profiling_window(work / "artifacts" / "profile_export.jsonl"))}


def side_by_side(ours: dict, as_aiperf: dict, theirs: dict, s: LoadSettings) -> Table:
    """`load`'s figures, the same requests timed by aiperf's definitions, and aiperf's: the second column
    against the first is the definitions' difference, the third against the second the instruments'."""
    rows = [("Successful requests", "completed"), ("Failed requests", "failed"), ("Benchmark duration (s)", "duration"),
            ("Total input tokens", "total_input_tokens"), ("Total generated tokens", "total_output_tokens"),
            ("Request throughput (req/s)", "request_throughput"),
            *([("Request goodput (req/s)", "request_goodput")] if s.goodput else []),
            ("Output token throughput (tok/s)", "output_throughput"),
            ("Total token throughput (tok/s)", "total_token_throughput"),
            ("Client CPU in the timed run (s)", "client_cpu_s")]
    for name, short, _ in LATENCIES:
        rows += [(f"Mean {short} (ms)", f"mean_{name}_ms"), (f"Median {short} (ms)", f"median_{name}_ms")]
        rows += [(f"P{p:g} {short} (ms)", f"p{p:g}_{name}_ms") for p in s.percentiles]
    table = Table(title=f"load and aiperf: the same {s.num_requests} requests, servers of the same settings "
                        f"({s.model})")
    for col in ("figure", "load", "load, aiperf's definitions", "aiperf", "aiperf / second column"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for label, key in rows:
        values = [ours.get(key), as_aiperf.get(key), theirs.get(key)]
        ratio = f"{values[2] / values[1]:.3f}" if values[1] and values[2] is not None else "-"
        fmt = ",.0f" if key in COUNTS else ",.2f"
        table.add_row(label, *("-" if v is None else format(v, fmt) for v in values), ratio)
    return table


def compare_with_aiperf(url: str, s: LoadSettings, ours: dict, records: list[dict], aiperf: str, model: str,
                        console: Console) -> dict:
    """aiperf against ``url`` with ``s``, after `load` measured ``ours`` (from ``records``) on a server of the
    same settings; prints the three columns, returns aiperf's figures."""
    from common.prepare import resolve_model  # the checkpoint folder holds the tokenizer aiperf counts with
    theirs = run_aiperf(aiperf, url, s, str(resolve_model(model)), console)
    as_aiperf = calculate_metrics(records, ours["duration"], s.percentiles, s.goodput, times="content_times")
    console.print(side_by_side(ours, as_aiperf | {"client_cpu_s": ours["client_cpu_s"]}, theirs, s))
    return theirs

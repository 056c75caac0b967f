"""python -m stages.bench.soak --minutes M --rate R [--plot F.png] [--json F.json]

The stage 07 server (stage 05's server, stage 06's speculation on) in a process of its own under open-loop
Poisson traffic (traffic.py) for M minutes, an X-ray viewer connected all along; every few seconds its RSS, file
descriptors, threads, KV blocks, grammar-cache bytes (probe.py); then the verdict (verdict.py), the requests by
kind, and the series as a plot. Exit status 1 when the verdict fails. docs/soak.md says how to run it and why.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time

import httpx
from rich.console import Console
from rich.live import Live

from stages.bench import children

from . import probe, report
from .traffic import KINDS, Traffic
from .verdict import verdict

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second (Poisson arrivals)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=48, help="per answer at most")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--kv-memory", default="256MiB")
    ap.add_argument("--grammar-cache-mb", type=float, default=64)
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, metavar="F.png")
    ap.add_argument("--json", default=None, metavar="F.json")
    ap.add_argument("--server-log", default=os.devnull, metavar="FILE", help="where the server's own output goes")
    return ap.parse_args(argv)


def server_command(args, port: int) -> list[str]:
    return [sys.executable, "-m", "stages.07_structured", "serve", "--port", str(port), "--model", args.model,
            "--max-num-seqs", str(args.max_num_seqs), "--kv-memory", args.kv_memory,
            "--grammar-cache-mb", str(args.grammar_cache_mb), "--speculative-config", json.dumps(SPECULATIVE)]


def viewer(url: str, stop: threading.Event, seen: list[int]) -> None:
    """An X-ray page's connection, reading every event until the soak ends (reconnecting if cut)."""
    while not stop.is_set():
        try:
            with httpx.stream("GET", url + "/xray/events", timeout=30) as r:
                for line in r.iter_lines():
                    seen[0] += line.startswith("event: step")
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            time.sleep(1)


async def drive(url: str, pid: int, args, console: Console) -> tuple[list[dict], Traffic]:
    traffic, samples, start = Traffic(url, args.rate, args.max_tokens, args.seed), [], time.monotonic()
    # Warm-up: every kind at once, the 1 MB predictions in pairs, so that every pool and cache reaches its working
    # size before the window the verdict reads (the allocator keeps what a burst took: docs/soak.md).
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await asyncio.gather(*(traffic.one(http, k) for k in list(KINDS) + ["big_prediction"] * 2))
    run = asyncio.create_task(traffic.run(args.minutes * 60))
    with Live(report.live_table(samples, traffic, args.minutes), console=console, refresh_per_second=1) as live:
        while not run.done():
            samples.append(await asyncio.to_thread(probe.sample, url, pid, time.monotonic() - start))
            samples[-1]["in_flight"] = traffic.in_flight
            live.update(report.live_table(samples, traffic, args.minutes))
            await asyncio.wait({run}, timeout=args.sample_every)
        for _ in range(30):  # the drain: every block must come back
            samples.append(await asyncio.to_thread(probe.sample, url, pid, time.monotonic() - start))
            samples[-1]["in_flight"] = 0
            if samples[-1]["kv_used"] == 0:
                break
            await asyncio.sleep(1)
    return samples, traffic


def run_soak(args, console: Console | None = None) -> dict:
    console = console or Console()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"MALLOC_ARENA_MAX": "2"}  # docs/soak.md: one arena per thread kept RSS stepping up
    log = open(args.server_log, "w")
    with log, children.session(server_command(args, port), grace=60, env=env, stdout=log, stderr=log) as server:
        deadline = time.monotonic() + 600
        while not ready(url, server):
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not answer /health within 600 s")
            time.sleep(0.5)
        stop, seen = threading.Event(), [0]
        watcher = threading.Thread(target=viewer, args=(url, stop, seen), daemon=True)
        watcher.start()
        try:
            samples, traffic = asyncio.run(drive(url, server.pid, args, console))
        finally:
            stop.set()
    result = verdict(samples, traffic.outcomes, traffic.ttfts, args.minutes)
    result |= {"samples": samples, "counts": traffic.counts, "outcomes": traffic.outcomes,
               "problems": traffic.problems, "ttfts": traffic.ttfts, "xray_steps_seen": seen[0],
               "settings": vars(args) | {"machine": os.uname().nodename}}
    return result


def ready(url: str, server) -> bool:
    """True once /health answers 200; raises if the server died first."""
    if server.poll() is not None:
        raise RuntimeError(f"the server exited with code {server.returncode} before it was ready")
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv=None) -> None:
    args, console = arguments(argv), Console()
    result = run_soak(args, console)
    console.print(report.kinds_table(result["counts"]))
    console.print(report.verdict_table(result))
    for p in result["problems"][:10]:
        console.print(f"  [red]{p}[/]")
    peak = max((s["in_flight"] for s in result["samples"]), default=0)
    console.print(f"X-ray viewer saw {result['xray_steps_seen']:,} steps; requests in flight at the samples: "
                  f"median {sorted(s['in_flight'] for s in result['samples'])[len(result['samples']) // 2]}, "
                  f"peak {peak}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if args.plot:
        report.plot(result["samples"], result["ttfts"], args.plot)
        console.print(f"plot: {args.plot}")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()

"""python -m stages.bench.soak --minutes M [--concurrency C | --rate R] [--plot F.png] [--json F.json]
python -m stages.bench.soak probe [--url URL]     (the hostile cases one by one: hostile.py)

The stage 07 server (stage 05's server, stage 06's speculation on) in a process of its own under C clients in a
closed loop, or open-loop Poisson arrivals at R a second (traffic.py), for M minutes, an X-ray viewer connected
all along; every few seconds its RSS, file descriptors, threads, KV blocks, grammar-cache bytes and the requests
in flight (sampler.py); then the verdict (verdict.py), the requests by kind, and the series as a plot. Exit
status 1 when the verdict fails. docs/soak.md says how to run it and why.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

import httpx
from rich.console import Console
from rich.live import Live

from . import report, sampler, server
from .traffic import KINDS, Traffic
from .verdict import IN_FLIGHT, verdict


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=12, help="clients in a closed loop (the default load)")
    ap.add_argument("--rate", type=float, default=None, help="open-loop Poisson arrivals per second instead")
    ap.add_argument("--in-flight", type=int, nargs=2, default=list(IN_FLIGHT), metavar=("LOW", "HIGH"),
                    help="the band the median of requests in flight must land in (the verdict fails outside)")
    ap.add_argument("--kinds", default=None, help="only these kinds, comma-separated (to find what grows)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=48, help="per answer at most")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--kv-memory", default="256MiB")
    ap.add_argument("--grammar-cache-mb", type=float, default=16,
                    help="small, so that distinct schemas fill it within the warm-up: the window sees it evict")
    ap.add_argument("--xray-window", type=int, default=2000,
                    help="the server's X-ray recording on, a ring of this many steps (0: off)")
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, metavar="F.png")
    ap.add_argument("--json", default=None, metavar="F.json")
    ap.add_argument("--server-log", default=os.devnull, metavar="FILE", help="where the server's own output goes")
    return ap.parse_args(argv)


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
    traffic, samples, start = Traffic(url, args.rate or 0, args.max_tokens, args.seed), [], time.monotonic()
    kinds = {k: KINDS[k] for k in args.kinds.split(",")} if args.kinds else KINDS
    # Warm-up: every kind at once, the 1 MB predictions in pairs, so that every pool and cache reaches its working
    # size before the window the verdict reads (the allocator keeps what a burst took: docs/soak.md).
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await asyncio.gather(*(traffic.one(http, k) for k in list(KINDS) + ["big_prediction"] * 2 if k in kinds))
    seconds = args.minutes * 60
    load = traffic.run(seconds, kinds) if args.rate else traffic.run_closed(seconds, args.concurrency, kinds)
    run = asyncio.create_task(load)
    with Live(report.live_table(samples, traffic, args.minutes), console=console, refresh_per_second=1) as live:
        while not run.done():
            samples.append(await asyncio.to_thread(sampler.sample, url, pid, time.monotonic() - start))
            samples[-1]["in_flight"] = traffic.in_flight
            live.update(report.live_table(samples, traffic, args.minutes))
            await asyncio.wait({run}, timeout=args.sample_every)
        for _ in range(30):  # the drain: every block must come back
            samples.append(await asyncio.to_thread(sampler.sample, url, pid, time.monotonic() - start))
            samples[-1]["in_flight"] = 0
            if samples[-1]["kv_used"] == 0:
                break
            await asyncio.sleep(1)
    return samples, traffic


def run_soak(args, console: Console | None = None) -> dict:
    console = console or Console()
    with server.serving(args, args.server_log) as (url, proc):
        stop, seen = threading.Event(), [0]
        watcher = threading.Thread(target=viewer, args=(url, stop, seen), daemon=True)
        watcher.start()
        try:
            samples, traffic = asyncio.run(drive(url, proc.pid, args, console))
        finally:
            stop.set()
    result = verdict(samples, traffic.outcomes, traffic.ttfts, args.minutes, tuple(args.in_flight))
    result |= {"samples": samples, "counts": traffic.counts, "outcomes": traffic.outcomes,
               "problems": traffic.problems, "ttfts": traffic.ttfts, "latencies": traffic.latencies,
               "xray_steps_seen": seen[0],
               "settings": vars(args) | {"machine": os.uname().nodename}}
    return result


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"]:  # the hostile client's cases, one by one, the server's health after each
        from .hostile import main as probe_main
        return probe_main(argv[1:])
    args, console = arguments(argv), Console()
    result = run_soak(args, console)
    console.print(report.kinds_table(result["counts"]))
    console.print(report.verdict_table(result))
    console.print(report.latency_table(result["ttfts"], result["latencies"]))
    for p in result["problems"][:10]:
        console.print(f"  [red]{p}[/]")
    console.print(f"X-ray viewer saw {result['xray_steps_seen']:,} steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if args.plot:
        report.plot(result["samples"], result["ttfts"], args.plot)
        console.print(f"plot: {args.plot}")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()

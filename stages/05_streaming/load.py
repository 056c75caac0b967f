"""A load run: N concurrent streaming clients against the server, measured from the client side.

Starts the server (`python -m stages.05_streaming serve`) in its own process on a free
loopback port, sends the chat workload through `/v1/chat/completions` with
``"stream": true`` (each client sends its next request when the previous one ends), times
every token as it arrives, then shuts the server down. The clients run in this process, as
real clients would run elsewhere: with the server and 32 clients in one Python process, the
clients' parsing competed with the engine's thread for the interpreter, and the run measured
0.84x of `generate` where the same server loaded from another process gave 0.97x.
"""
from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time

import httpx
from rich.console import Console
from rich.table import Table

from common.tools.report import percentile
from common.tools.workloads import CHAT_QUESTIONS


async def one_request(http: httpx.AsyncClient, url: str, model: str, question: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start, times, tokens = time.perf_counter(), [], 0
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if data["choices"] and data["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"ttft": times[0] - start if times else end - start, "e2e": end - start, "tokens": tokens,
            "tpot": (times[-1] - times[0]) / (tokens - 1) if tokens > 1 and len(times) > 1 else None}


async def run_clients(url: str, model: str, clients: int, num_requests: int, max_tokens: int) -> list[dict]:
    queue = list(range(num_requests))
    results = []

    async def client(http):
        while queue:
            i = queue.pop(0)
            results.append(await one_request(http, url, model, CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)], max_tokens))

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return results


def load_with_server(serve_args: list[str], model: str, clients: int = 16, num_requests: int = 64,
                     max_tokens: int = 64, console: Console | None = None, start_timeout: float = 600) -> dict:
    """Start ``serve`` with ``serve_args`` on a free port in a child process, load it, stop it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "stages.05_streaming", "serve", "--host", "127.0.0.1", "--port", str(port),
           *serve_args]
    server = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with code {server.returncode} before it was ready")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer /health within {start_timeout:.0f} s")
            time.sleep(0.2)
        return load_url(url, model, clients, num_requests, max_tokens, console)
    finally:
        server.send_signal(signal.SIGTERM)  # a clean shutdown: requests in flight end, the port is freed
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def load_url(url: str, model: str, clients: int = 16, num_requests: int = 64, max_tokens: int = 64,
             console: Console | None = None) -> dict:
    """The load run against the server at ``url`` (`serve` or `cluster`)."""
    console = console or Console()
    start = time.perf_counter()
    results = asyncio.run(run_clients(url, model, clients, num_requests, max_tokens))
    wall = time.perf_counter() - start
    ttft = [r["ttft"] for r in results]
    tpot = [r["tpot"] for r in results if r["tpot"] is not None]
    tokens = sum(r["tokens"] for r in results)
    figures = {"clients": clients, "requests": len(results), "output tokens": tokens, "wall s": wall,
               "output tok/s": tokens / wall, "TTFT p50 s": percentile(ttft, 50), "TTFT p99 s": percentile(ttft, 99),
               "TPOT p50 ms": 1e3 * percentile(tpot, 50), "TPOT p99 ms": 1e3 * percentile(tpot, 99),
               "e2e p50 s": percentile([r["e2e"] for r in results], 50)}
    table = Table(title=f"load run: {clients} streaming clients, {model}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in figures.items():
        table.add_row(k, f"{v:,.3f}" if isinstance(v, float) else f"{v:,}")
    console.print(table)
    return figures

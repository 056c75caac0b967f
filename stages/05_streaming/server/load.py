"""A load run: N concurrent streaming clients against the server, measured from the client side.

Starts the server (`python -m stages.05_streaming serve`) in its own process on a free
loopback port, sends the chat workload through `/v1/chat/completions` with
``"stream": true`` (each client sends its next request when the previous one ends), times
every token as it arrives, then shuts the server down. The clients run in this process, as
real clients would run elsewhere: with the server and 32 clients in one Python process, the
clients' parsing competed with the engine's thread for the interpreter, and the run measured
0.84x of `generate` where the same server loaded from another process gave 0.97x. One short
request warms the server first, untimed, as the ladder warms each engine.
"""
from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from urllib.parse import SplitResult, urlsplit

import httpx
from rich.console import Console
from rich.table import Table

from common.tools.report import percentile
from common.tools.workloads import CHAT_QUESTIONS


async def one_request(url: SplitResult, model: str, question: str, max_tokens: int,
                      api_key: str | None = None) -> dict:
    """One streamed chat completion over a bare HTTP/1.1 connection, each content event timed as it arrives.

    A load client is a measuring instrument that shares the machine with the server: a bare reader spends a
    fraction of httpx's CPU per streamed event (docs/streaming.md), CPU otherwise taken from the server.
    """
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    start, times, tokens = time.perf_counter(), [], 0
    reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
    try:
        writer.write(f"POST {url.path.rstrip('/')}/v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n{auth}"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        if not head.startswith("HTTP/1.1 200"):
            raise RuntimeError(f"{head.splitlines()[0]}: {(await reader.read(1000)).decode(errors='replace')}")
        if "transfer-encoding: chunked" not in head.lower():
            raise RuntimeError("the server did not answer with a chunked event stream")
        pending = b""
        while size := int((await reader.readline()).split(b";")[0], 16):  # chunked encoding: size, data, CRLF
            *events, pending = (pending + (await reader.readexactly(size + 2))[:-2]).split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: {"):
                    continue
                data = json.loads(event[6:])
                if data.get("error"):
                    raise RuntimeError(f"the stream ended with an error: {data['error']}")
                if data["choices"] and data["choices"][0]["delta"].get("content"):
                    times.append(time.perf_counter())
                if data.get("usage"):
                    tokens = data["usage"]["completion_tokens"]
    finally:
        writer.close()
    end = time.perf_counter()
    return {"ttft": times[0] - start if times else end - start, "e2e": end - start, "tokens": tokens,
            "tpot": (times[-1] - times[0]) / (tokens - 1) if tokens > 1 and len(times) > 1 else None}


async def run_clients(url: str, model: str, clients: int, num_requests: int, max_tokens: int,
                      api_key: str | None = None) -> tuple[list[dict], float]:
    parts, queue, results = urlsplit(url), list(range(num_requests)), []
    if parts.scheme != "http":
        raise ValueError(f"load speaks plain HTTP; give an http:// URL, not {url!r}")

    async def client():
        while queue:
            i = queue.pop(0)
            result = await one_request(parts, model, CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)], max_tokens, api_key)
            results.append({"request": i} | result)

    await one_request(parts, model, CHAT_QUESTIONS[0], 4, api_key)  # warm, untimed, as the ladder warms each engine
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return results, time.perf_counter() - start


def load_with_server(serve_args: list[str], model: str, clients: int = 16, num_requests: int = 64,
                     max_tokens: int = 64, console: Console | None = None, start_timeout: float = 600,
                     api_key: str | None = None) -> dict:
    """Start ``serve`` with ``serve_args`` on a free port in a child process, load it, stop it (the child reads
    its API key, if any, from STEPWISE_API_KEY as this process does)."""
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
        return load_url(url, model, clients, num_requests, max_tokens, console, api_key)
    finally:
        server.send_signal(signal.SIGTERM)  # a clean shutdown: requests in flight end, the port is freed
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def load_url(url: str, model: str, clients: int = 16, num_requests: int = 64, max_tokens: int = 64,
             console: Console | None = None, api_key: str | None = None) -> dict:
    """The load run against the server at ``url`` (`serve` or `cluster`)."""
    console = console or Console()
    results, wall = asyncio.run(run_clients(url, model, clients, num_requests, max_tokens, api_key))
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

"""A load run: N concurrent streaming clients against the server, measured from the client side.

Starts the server on a free loopback port in this process, sends the chat workload
through `/v1/chat/completions` with ``"stream": true`` (each client sends its next
request when the previous one ends), and times every token as it arrives.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import uvicorn
from rich.console import Console
from rich.table import Table

from common.tools.report import percentile
from common.tools.workloads import CHAT_QUESTIONS

from .engine import LLM
from .server import create_app


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


def load_run(llm: LLM, model: str, clients: int = 16, num_requests: int = 64, max_tokens: int = 64,
             console: Console | None = None) -> dict:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(llm, model), log_level="warning"))
    done, out = threading.Event(), {}

    def clients_run() -> None:  # HTTP and the clients in background threads; the engine keeps the main thread
        try:
            threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
            while not server.started:
                time.sleep(0.05)
            out["figures"] = load_url(url, model, clients, num_requests, max_tokens, console)
            server.should_exit = True
        finally:
            done.set()

    llm.run_forever(done, on_start=threading.Thread(target=clients_run, name="clients", daemon=True).start)
    if "figures" not in out:
        raise RuntimeError("the load run failed; see the error above")
    return out["figures"]


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

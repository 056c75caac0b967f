"""A load run in `vllm bench serve`'s terms: streaming clients against the server, measured from the client side.

Starts the server (`python -m stages.05_streaming serve`) in its own process on a free loopback port, sends
the chat workload through `/v1/chat/completions` with ``"stream": true``, records when each request was sent
and when each chunk arrived, then shuts the server down; `metrics` turns the records into vLLM's
figures. Requests arrive as vLLM's benchmark sends them: all at once (``--request-rate inf``, its default)
or as a Poisson process (exponential gaps, seeded), each waiting for one of ``--max-concurrency`` slots if
a cap is given. A cap at rate inf is a closed loop: N clients, each sending its next request when its last
one ends (``--clients N``, the same setting under its older name, 16 unless told). vLLM rescales its
Poisson gaps so the last arrival lands at exactly N/R; these are left as drawn, as aiperf leaves them.

The server runs in a process of its own, as it would for real clients elsewhere: clients in the server's
process would compete with the engine's thread for the interpreter and slow it (docs/streaming.md measures by
how much). One short request warms the server first, untimed (if it fails, the run stops there and says why);
a request that fails afterwards is counted as failed, as vLLM counts it.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import socket
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

import httpx
from rich.console import Console

from stages.workloads import CHAT_QUESTIONS

from .. import children
from .metrics import calculate_metrics, metrics_table


@dataclass
class LoadSettings:
    """One run's workload and arrivals: what `load` sends, and what the aiperf run beside it is told to send."""
    model: str
    num_requests: int = 64
    max_tokens: int = 96
    max_concurrency: int | None = 16
    request_rate: float = math.inf
    seed: int = 0
    ignore_eos: bool = False
    api_key: str | None = None
    percentiles: tuple[float, ...] = (99,)
    goodput: dict[str, float] = field(default_factory=dict)

    def prompts(self) -> list[str]:
        return [CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)] for i in range(self.num_requests)]


def arrival_times(n: int, request_rate: float, seed: int = 0) -> list[float]:
    """When each of ``n`` requests arrives, in seconds from the start: a Poisson process at ``request_rate``
    (independent exponential gaps of mean 1/rate, the first one included, drawn from ``seed``), or all at 0."""
    if math.isinf(request_rate):
        return [0.0] * n
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(request_rate)
        times.append(t)
    return times


async def one_request(url: SplitResult, model: str, question: str, max_tokens: int, api_key: str | None = None,
                      ignore_eos: bool = False) -> dict:
    """One streamed chat completion over a bare HTTP/1.1 connection: its send time, the arrival time of each
    chunk that carries a choice, the server's usage counts, and whether it succeeded (if not, why).

    A load client is a measuring instrument that shares the machine with the server: a bare reader spends a
    fraction of httpx's CPU per streamed event (docs/streaming.md), CPU otherwise taken from the server.
    """
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    body = json.dumps(body | ({"ignore_eos": True} if ignore_eos else {})).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    record = {"success": False, "error": "", "start": time.perf_counter(), "chunk_times": [], "content_times": [],
              "output_tokens": 0, "prompt_tokens": 0}
    usage = None
    try:
        reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
        try:
            writer.write(f"POST {url.path.rstrip('/')}/v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
                         f"{auth}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + body)
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
                    if choices := data.get("choices"):
                        record["chunk_times"].append(now := time.perf_counter())
                        if choices[0].get("delta", {}).get("content"):
                            record["content_times"].append(now)
                    usage = data.get("usage") or usage
        finally:
            writer.close()
        if not record["chunk_times"]:
            raise RuntimeError("no streamed chunk carried a choice")
        if usage is None:
            raise RuntimeError("the stream carried no usage (stream_options.include_usage was ignored)")
        record.update(success=True, output_tokens=usage["completion_tokens"], prompt_tokens=usage["prompt_tokens"])
    except (OSError, EOFError, ValueError, KeyError, RuntimeError) as e:  # a failed request is counted, not raised
        record["error"] = f"{type(e).__name__}: {e}"
    return record


async def run_clients(url: str, s: LoadSettings) -> tuple[list[dict], float]:
    """Every request of ``s`` sent on its schedule; the records, each with its index and the time it arrived
    (it is sent then, or when a slot frees), and the benchmark's duration (the schedule's start to the last
    request done). Times are `time.perf_counter`'s."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"load speaks plain HTTP; give an http:// URL, not {url!r}")
    prompts, arrivals = s.prompts(), arrival_times(s.num_requests, s.request_rate, s.seed)
    warm = await one_request(parts, s.model, prompts[0], 4, s.api_key)  # untimed, as the ladder warms each engine
    if not warm["success"]:
        raise RuntimeError(f"the warm-up request failed: {warm['error']}")
    slots = asyncio.Semaphore(s.max_concurrency) if s.max_concurrency else contextlib.nullcontext()

    async def request(i: int) -> dict:
        await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
        async with slots:
            record = await one_request(parts, s.model, prompts[i], s.max_tokens, s.api_key, s.ignore_eos)
        return {"request": i, "arrival_time": start + arrivals[i]} | record

    start = time.perf_counter()
    records = await asyncio.gather(*(request(i) for i in range(s.num_requests)))
    return records, time.perf_counter() - start


def free_url() -> str:
    """An http:// URL on a loopback port no one listens on now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def started(cmd: list[str], url: str, start_timeout: float = 600, **popen):
    """The server ``cmd`` (``popen`` as `subprocess.Popen` takes it) in a session of its own; yields the process
    once ``url``/health answers 200, then stops it however the block ends (`children.session`)."""
    with children.session(cmd, grace=60, **popen) as server:  # SIGTERM first: requests in flight end, the port freed
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
        yield server


@contextlib.contextmanager
def serving(serve_args: list[str], start_timeout: float = 600):
    """``serve`` with ``serve_args`` in a child process on a free loopback port; yields its URL, then stops it
    however the block ends. The child reads its API key, if any, from STEPWISE_API_KEY as this process does."""
    url = free_url()
    port = url.rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "stages.05_streaming", "serve", "--host", "127.0.0.1", "--port", port, *serve_args]
    with started(cmd, url, start_timeout):
        yield url


def load_url(url: str, s: LoadSettings, console: Console | None = None) -> tuple[dict, list[dict]]:
    """The load run against the server at ``url`` (`serve` or `cluster`): prints vLLM's figures and returns them,
    with the CPU time the clients took (``client_cpu_s``, the warm-up's one short request included: CPU the
    server did not get when both share a machine), and the requests' records."""
    console = console or Console()
    cpu = time.process_time()
    records, duration = asyncio.run(run_clients(url, s))
    cpu = time.process_time() - cpu
    failed = [r for r in records if not r["success"]]
    for r in failed[:10]:
        console.print(f"[red]request {r['request']} failed:[/] {r['error']}")
    m = calculate_metrics(records, duration, s.percentiles, s.goodput) | {"client_cpu_s": cpu}
    arrivals = "all at once" if math.isinf(s.request_rate) else f"Poisson at {s.request_rate:g}/s"
    cap = f", at most {s.max_concurrency} in flight" if s.max_concurrency else ""
    console.print(metrics_table(m, f"load ({s.model}): {s.num_requests} requests arriving {arrivals}{cap}",
                                s.percentiles, s.max_concurrency, s.request_rate))
    return m, records


"""`python -m stages.05_streaming serve` under SIGTERM: it stops accepting, gives the requests in flight
--shutdown-timeout seconds, ends every open stream with an event and [DONE], answers the rest with a 503,
and exits; a second signal exits at once."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
LONG = {"model": "tiny", "prompt": [8, 9, 10], "max_tokens": 1000, "ignore_eos": True, "temperature": 0}


class ServerProcess:
    def __init__(self, *args: str):
        cmd = [sys.executable, "-m", "stages.05_streaming", "serve", "--model", "tiny", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url, self.log = None, []
        for line in self.proc.stderr:  # uvicorn says which port it took
            self.log.append(line)
            if match := re.search(r"running on (http://127\.0\.0\.1:\d+)", line):
                self.url = match.group(1)
                break
        assert self.url, "".join(self.log)
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(request):
    s = ServerProcess(*request.param)
    yield s
    s.stop()


def open_streams(url: str, n: int) -> tuple[list[threading.Thread], dict, threading.Barrier]:
    """n long streams, each read in a thread; the barrier passes once every stream has its first event."""
    results, started = {}, threading.Barrier(n + 1, timeout=60)

    def read(i):
        lines = []
        try:
            with httpx.stream("POST", url + "/v1/completions", json=LONG | {"stream": True}, timeout=60) as r:
                for line in filter(None, r.iter_lines()):
                    lines.append(line)
                    if len(lines) == 1:
                        started.wait()
        except httpx.HTTPError as e:  # the connection was cut
            lines.append(f"cut: {type(e).__name__}")
        results[i] = lines

    threads = [threading.Thread(target=read, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results, started


def wait_until_in_engine(url: str, n: int, timeout: float = 30) -> None:
    """Until the engine holds n requests (/metrics: waiting + running): a request the server has not accepted yet
    would meet a closed socket at SIGTERM, not the 503 this test is about."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=5).text
        held = sum(float(m) for m in re.findall(r"^stepwise_requests_(?:waiting|running) (\S+)$", text, re.M))
        if held >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"the engine never held {n} requests:\n{text}")


GRACE = 0.25  # seconds: the tiny model generated 1,000 tokens for four requests in about one second on a fast CPU


@pytest.mark.parametrize("server", [("--shutdown-timeout", str(GRACE))], indirect=True)
def test_sigterm_ends_every_stream_with_an_event_and_exits_within_the_grace_period(server):
    threads, streams, started = open_streams(server.url, 3)
    plain = {}
    waiter = threading.Thread(target=lambda: plain.update(r=httpx.post(server.url + "/v1/completions", json=LONG,
                                                                        timeout=60)))
    waiter.start()
    started.wait()  # three streams are generating
    wait_until_in_engine(server.url, 4)  # and the non-streaming request too (not still in the listen backlog)
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)  # within the grace period: the listener is closed, the server still running
    with pytest.raises(httpx.ConnectError):  # it stops accepting at once
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=5)
    assert server.proc.wait(timeout=30) == 0
    took = time.monotonic() - sent
    for t in [*threads, waiter]:
        t.join(10)
    # 1,000 tokens take longer than the grace period: every request was stopped at the deadline.
    assert GRACE <= took < GRACE + 8, took  # the margin: closing connections, stopping the engine, interpreter exit
    for lines in streams.values():
        assert lines[-1] == "data: [DONE]" and "shutting down" in lines[-2], lines[-2:]
    assert plain["r"].status_code == 503 and "shutting down" in plain["r"].json()["error"]["message"]


@pytest.mark.parametrize("server", [("--shutdown-timeout", "60")], indirect=True)
def test_a_second_signal_exits_at_once(server):
    threads, _, started = open_streams(server.url, 2)
    started.wait()
    server.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=10) == 128 + signal.SIGTERM
    assert time.monotonic() - sent < 3
    for t in threads:
        t.join(10)


def test_load_command_serves_from_its_own_process_and_stops_it():
    """`load` starts `serve` in a child process on a free port, streams the chat workload through it from this
    process, prints the client-side figures in vLLM's terms (`--clients` still names the cap) and shuts the
    server down cleanly (SIGTERM) when done."""
    out = subprocess.run([sys.executable, "-m", "stages.bench.load", "--model", "tiny", "--clients", "3",
                          "--num-requests", "6", "--max-tokens", "8"], cwd=ROOT, text=True, capture_output=True,
                         timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert out.returncode == 0, out.stderr[-2000:]
    figures = dict(re.findall(r"│ (Successful requests|Failed requests|Total generated tokens|Maximum request "
                              r"concurrency)\s+│\s+([\d,]+) │", out.stdout))
    assert figures == {"Maximum request concurrency": "3", "Successful requests": "6", "Failed requests": "0",
                       "Total generated tokens": figures["Total generated tokens"]}
    assert 6 <= int(figures["Total generated tokens"]) <= 48  # at least one token per request, at most max_tokens
    assert "Finished server process" in out.stderr + out.stdout  # the server drained and exited

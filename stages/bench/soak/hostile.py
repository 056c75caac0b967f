"""The probe: a hostile client's cases against a running server, one at a time, and the server's health after each.

Issue 56's probe found its four faults by trying, through the real ``openai`` client and raw HTTP, what users and
attackers send. This keeps those tries as one command, so that any change to the server can be checked the same
way: each case says what the server answered and whether that is what a user should get (a clear 400 naming the
field for what cannot be served; a valid 200 for what can), and after each case the server must be healthy:
/health answers, every KV block is free once the case's requests are gone, and a short request (the canary)
still finishes, which a stalled engine thread or event loop would not let it.

    python -m stages.bench.soak probe                   # starts the stage 07 server on SmolLM2 itself
    python -m stages.bench.soak probe --url http://127.0.0.1:8000 --model smollm2-135m
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import jsonschema
import openai

MSG = [{"role": "user", "content": "Describe a tree."}]
TREE = {"$defs": {"node": {"type": "object", "additionalProperties": False, "required": ["name"], "properties": {
    "name": {"type": "string", "maxLength": 6}, "kids": {"type": "array", "maxItems": 2,
                                                         "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
ENUM = {"enum": [f"v{i}" for i in range(1000)]}


def nested(levels: int) -> dict:
    schema = {"type": "integer", "minimum": 0, "maximum": 9}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    return schema


def refused(call, param: str) -> tuple[bool, str]:
    """The case must be a 400 naming ``param`` (invalid_request_error)."""
    try:
        out = call()
        list(out) if isinstance(out, openai.Stream) else out
    except openai.BadRequestError as e:
        err = e.body or {}
        ok = err.get("type") == "invalid_request_error" and param in (str(err.get("param")) + err.get("message", ""))
        return ok, f"400 {err.get('param')}: {err.get('message', '')[:130]}"
    except openai.APIError as e:
        return False, f"{type(e).__name__} {getattr(e, 'status_code', '')}: {str(e)[:90]}"
    return False, "200: served what no output satisfies"


def served(c, model: str, schema: dict) -> tuple[bool, str]:
    """A 200 whose output, when it ended by itself, is valid against ``schema`` (cut by max_tokens: a prefix)."""
    out = c.chat.completions.create(model=model, messages=MSG, max_tokens=48, temperature=0, extra_body={
        "structured_outputs": {"json": schema, "disable_any_whitespace": True}})
    text, finish = out.choices[0].message.content, out.choices[0].finish_reason
    if finish != "stop":
        return True, f"200, cut by max_tokens after {len(text)} chars"
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as e:
        return False, f"200 but invalid: {str(e)[:80]}"
    return True, f"200, valid: {text[:40]}"


def n3_streamed(c, model: str) -> tuple[bool, str]:
    finish: dict[int, str] = {}
    for chunk in c.chat.completions.create(model=model, messages=MSG, max_tokens=16, n=3, stream=True, seed=1,
                                           temperature=0.8, stream_options={"include_usage": True}):
        finish |= {ch.index: ch.finish_reason for ch in chunk.choices if ch.finish_reason}
    return sorted(finish) == [0, 1, 2], f"200, 3 streams ended: {sorted(finish.values())}"


def disconnect(c, model: str) -> tuple[bool, str]:
    stream = c.chat.completions.create(model=model, messages=MSG, max_tokens=200, stream=True)
    got = sum(1 for _, _ in zip(range(3), stream))
    stream.close()
    return got == 3, f"read {got} chunks of a 200-token stream, then hung up"


def prediction_beside_short(c, model: str) -> tuple[bool, str]:
    """A 1 MB prediction (preparation off the engine thread) while a short request runs: the short one's time
    beside it against its time alone (at most 3x + 0.5 s, as tests/test_prepare_off_thread.py)."""
    alone = sorted(short(c, model) for _ in range(3))[1]
    big = ("It is a truth universally acknowledged. " * 25_000)[:1_000_000]
    answer = {}
    worker = threading.Thread(target=lambda: answer.update(out=c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Repeat."}], max_tokens=16, temperature=0,
        prediction={"type": "content", "content": big})))
    worker.start()
    time.sleep(0.3)
    beside = short(c, model)
    worker.join(300)
    d = answer["out"].usage.completion_tokens_details
    ok = beside < 3 * alone + 0.5 and d.accepted_prediction_tokens >= 0 and d.rejected_prediction_tokens >= 0
    return ok, f"both 200; the short one {beside * 1e3:.0f} ms beside it, {alone * 1e3:.0f} ms alone"


def viewers(url: str, how_many: int = 50) -> tuple[bool, str]:
    """``how_many`` X-ray pages connected at once, each until it has seen a step of a request sent meanwhile."""
    saw, stop = [0] * how_many, threading.Event()

    def view(i: int) -> None:
        with httpx.stream("GET", url + "/xray/events", timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("event: step"):
                    saw[i] += 1
                if saw[i] >= 2 or stop.is_set():
                    return

    threads = [threading.Thread(target=view, args=(i,), daemon=True) for i in range(how_many)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    httpx.post(url + "/v1/chat/completions", timeout=120, json={"messages": MSG, "max_tokens": 16})
    for t in threads:
        t.join(30)
    stop.set()
    seen = sum(s > 0 for s in saw)
    return seen == how_many, f"{seen} of {how_many} viewers saw the request's steps"


def slow_reader(c, model: str, url: str, rate: int = 64, seconds: float = 3.0) -> tuple[bool, str]:
    """A stream read at ``rate`` bytes a second, then dropped, while a short request must still run."""
    host = urlsplit(url)
    body = json.dumps({"model": model, "messages": MSG, "max_tokens": 200, "stream": True}).encode()
    sock = socket.create_connection((host.hostname, host.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    read, start, beside = 0, time.monotonic(), None
    while time.monotonic() - start < seconds:
        read += len(sock.recv(rate))
        if beside is None:
            beside = short(c, model)
        time.sleep(1.0)
    sock.close()
    return read > 0 and beside < 30, f"read {read} B at {rate} B/s, then hung up; a short request {beside * 1e3:.0f} ms"


def short(c, model: str) -> float:
    start = time.perf_counter()
    c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    return time.perf_counter() - start


def health(c, url: str, model: str) -> tuple[bool, str]:
    """/health, every KV block free and nothing running (waited for up to 20 s), and the canary's time."""
    with httpx.Client(base_url=url, timeout=30) as http:
        up = http.get("/health").status_code == 200
        deadline, used = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            text = http.get("/metrics").text
            used, running = (float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))
                             for name in ("stepwise_kv_blocks_used", "stepwise_requests_running"))
            if used == 0 and running == 0:
                break
            time.sleep(0.2)
    canary = short(c, model)
    ok = up and used == 0 and canary < 30
    return ok, f"/health {'ok' if up else 'DOWN'}, {used:g} KV blocks held, canary {canary * 1e3:.0f} ms"


def cases(c, url: str, model: str) -> dict:
    """Each case's name -> a call returning (as a user would expect, what the server answered)."""
    chat = dict(model=model, messages=MSG, max_tokens=8)
    so = lambda spec, stream=False: lambda: refused(lambda: c.chat.completions.create(  # noqa: E731
        **chat, stream=stream, extra_body={"structured_outputs": spec}), "structured_outputs")
    return {
        "schema with $ref recursion": lambda: served(c, model, TREE),
        "a 1,000-value enum": lambda: served(c, model, ENUM),
        "a 30-level schema": lambda: served(c, model, nested(30)),
        "a lookahead pattern": so({"regex": "(?=a)ab"}),
        "a regex no string matches, streamed": so({"regex": r"[^\s\S]"}, True),
        "an EBNF grammar with a syntax error": so({"grammar": 'root ::= ("a"'}),
        "n = 3, streamed": lambda: n3_streamed(c, model),
        "a disconnect mid-stream": lambda: disconnect(c, model),
        "a 1 MB prediction beside a short request": lambda: prediction_beside_short(c, model),
        "50 live X-ray viewers": lambda: viewers(url),
        "a 64 B/s slow reader": lambda: slow_reader(c, model, url),
    }


def probe(url: str, model: str) -> list[tuple[str, bool, str, bool, str]]:
    """Every case in turn: (case, answered as expected, what it answered, healthy after, health)."""
    c = openai.OpenAI(base_url=url + "/v1", api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0,
                      timeout=300)
    rows = []
    for name, case in cases(c, url, model).items():
        try:
            ok, answered = case()
        except Exception as e:  # a case that raises is a finding, not the end of the probe
            ok, answered = False, f"{type(e).__name__}: {str(e)[:100]}"
        rows.append((name, ok, answered, *health(c, url, model)))
    return rows


def main(argv=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from .server import serving
    ap = argparse.ArgumentParser(prog="python -m stages.bench.soak probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start the stage 07 server)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--kv-memory", default="128MiB")
    ap.add_argument("--grammar-cache-mb", type=float, default=64)
    args = ap.parse_args(argv)
    if args.url:
        rows = probe(args.url, args.model)
    else:
        with serving(args) as (url, _):
            rows = probe(url, args.model)
    t = Table(title=f"probe of the stage 07 server ({args.model})")
    for col in ("case", "answered", "", "health after", ""):
        t.add_column(col, overflow="fold")
    for name, ok, answered, healthy, how in rows:
        t.add_row(name, answered, "[green]ok[/]" if ok else "[red]FAIL[/]", how, "[green]ok[/]" if healthy else
                  "[red]FAIL[/]")
    Console().print(t)
    raise SystemExit(0 if all(r[1] and r[3] for r in rows) else 1)

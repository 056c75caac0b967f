"""The soak's clients: what users send, each answer checked, as a closed loop or open-loop Poisson arrivals.

Each request draws a kind (``KINDS``, by weight). Closed loop (``run_closed``, the soak's default): a fixed number
of clients, each sending its next request when its last one ends, so the server holds about that many in flight
whatever its speed: a soak must load the server (8-16 in flight) without drowning it, and an open loop at a rate
the server cannot keep up with measures its growing queue, not the server (docs/soak.md). Open loop (``run``):
each arrival on its own task, never waiting for the others. Every answer is checked against what its
request asked for: a schema's output with jsonschema, a pattern's with ``re.fullmatch``, a choice's against the
choices, a stop string absent from the text, a prediction's accepted + rejected counts within what was drafted,
a hostile body answered with a 400. A 5xx, or a 200 that fails its check, counts against the verdict.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import time

import httpx
import jsonschema

CHOICES = ["red", "green", "blue"]
REGEX = r"[A-Z]{2}-\d{3}"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "rank": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["city", "rank"], "additionalProperties": False}
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
        "of a wife. ") * 4
KINDS = {"chat": 14, "chat_stream": 16, "n3_stream": 5, "logprobs": 6, "prediction": 8, "big_prediction": 1,
         "schema": 8, "schema_distinct": 5, "regex": 6, "choice": 6, "stop": 6, "cancel": 5, "disconnect": 6,
         "hostile": 3}
HOSTILE = [b'{"model": "m", "messages": [', b'{"messages": [{"role": "user", "content": "hi"}], "n": 1000}',
           json.dumps({"messages": [{"role": "user", "content": "x"}],
                       "structured_outputs": {"regex": "[^\\s\\S]"}}).encode()]


def body_for(kind: str, rng: random.Random, max_tokens: int) -> dict:
    msg = [{"role": "user", "content": rng.choice(["Name a city.", "Say hello.", "Count to five.",
                                                   "Describe the sea in one line."])}]
    b = {"messages": msg, "max_tokens": max_tokens, "temperature": rng.choice([0, 0.8]), "seed": rng.randrange(1000)}
    if kind in ("chat_stream", "n3_stream", "disconnect"):
        b |= {"stream": True, "stream_options": {"include_usage": True}}
    if kind == "n3_stream":
        b["n"] = 3
    if kind == "logprobs":
        b |= {"logprobs": True, "top_logprobs": 3}
    if kind in ("prediction", "big_prediction"):
        size = 1_000_000 if kind == "big_prediction" else 2_000
        b |= {"prediction": {"type": "content", "content": (TEXT * (size // len(TEXT) + 1))[:size]},
              "messages": [{"role": "user", "content": "Repeat: " + TEXT[:200]}]}
    if kind == "schema":
        b["response_format"] = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    if kind == "schema_distinct":  # a schema no one sent before: compiled, cached, evicted in time
        b["structured_outputs"] = {"json": distinct_schema(rng), "disable_any_whitespace": True}
    if kind == "regex":
        b["structured_outputs"] = {"regex": REGEX}
    if kind == "choice":
        b["structured_outputs"] = {"choice": CHOICES}
    if kind == "stop":
        b["stop"] = [" the", "."]
    return b


def distinct_schema(rng: random.Random) -> dict:
    names = [f"f{rng.randrange(10**9)}" for _ in range(rng.randint(2, 6))]
    return {"type": "object", "properties": {n: {"enum": [f"v{i}" for i in range(rng.randint(2, 8))]} for n in names},
            "required": names[:1], "additionalProperties": False}


def problem(kind: str, body: dict, text: str, finish: str, usage: dict | None) -> str | None:
    """Why a 200's output does not match its request (None: it does). A constraint is checked when the output
    ended by itself ("stop"); cut by max_tokens, it is a prefix and only the counts are checked."""
    try:
        if finish == "stop":
            if kind == "schema":
                jsonschema.validate(json.loads(text), SCHEMA)
            if kind == "schema_distinct":
                jsonschema.validate(json.loads(text), body["structured_outputs"]["json"])
            if kind == "regex" and not re.fullmatch(REGEX, text):
                return f"{text!r} does not match {REGEX}"
            if kind == "choice" and text not in CHOICES:
                return f"{text!r} is not a choice"
        if kind == "stop" and any(s in text for s in body["stop"]):
            return f"a stop string is in {text!r}"
        if kind in ("prediction", "big_prediction"):
            d = (usage or {}).get("completion_tokens_details") or {}
            acc, rej = d.get("accepted_prediction_tokens"), d.get("rejected_prediction_tokens")
            if acc is None or rej is None or acc < 0 or rej < 0 or acc > usage["completion_tokens"]:
                return f"prediction counts {d} do not add up for {usage}"
    except (ValueError, jsonschema.ValidationError) as e:
        return f"{type(e).__name__}: {str(e)[:120]}"
    return None


class Traffic:
    """Counts by kind and outcome, the streamed requests' TTFT, and the requests in flight."""

    def __init__(self, url: str, rate: float, max_tokens: int, seed: int = 0):
        self.url, self.rate, self.max_tokens, self.rng = url, rate, max_tokens, random.Random(seed)
        self.counts: dict[str, dict[str, int]] = {k: {} for k in KINDS}
        self.outcomes = {"5xx": 0, "invalid": 0, "ok": 0, "4xx": 0, "other": 0}
        self.problems: list[str] = []
        self.ttfts: list[tuple[float, float]] = []
        self.latencies: list[tuple[float, float]] = []  # (arrival, seconds to the whole answer)
        self.in_flight = 0
        self.started = time.monotonic()

    def count(self, kind: str, outcome: str, why: str | None = None) -> None:
        self.counts[kind][outcome] = self.counts[kind].get(outcome, 0) + 1
        self.outcomes[outcome] += 1
        if why and len(self.problems) < 50:
            self.problems.append(f"{kind}: {why}")

    async def run(self, seconds: float, kinds: dict[str, int] | None = None) -> None:
        """Poisson arrivals for ``seconds``, then wait for the requests still in flight."""
        kinds = kinds or KINDS
        tasks: set[asyncio.Task] = set()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
        async with httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits) as http:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
                task = asyncio.create_task(self.one(http, kind))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(self.rng.expovariate(self.rate))
            await asyncio.gather(*tasks, return_exceptions=True)

    async def run_closed(self, seconds: float, concurrency: int, kinds: dict[str, int] | None = None) -> None:
        """``concurrency`` clients for ``seconds``, each starting a new request when its last one ends."""
        kinds = kinds or KINDS
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency + 8)
        async with httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits) as http:
            end = time.monotonic() + seconds

            async def client() -> None:
                while time.monotonic() < end:
                    await self.one(http, self.rng.choices(list(kinds), weights=list(kinds.values()))[0])

            await asyncio.gather(*(client() for _ in range(concurrency)))

    async def one(self, http: httpx.AsyncClient, kind: str) -> None:
        self.in_flight += 1
        arrival = time.monotonic() - self.started
        try:
            if kind == "hostile":
                r = await http.post("/v1/chat/completions", content=self.rng.choice(HOSTILE),
                                    headers={"Content-Type": "application/json"})
                self.judge(kind, r.status_code, None if r.status_code == 400 else f"hostile body got {r.status_code}")
                return
            body = body_for(kind, self.rng, self.max_tokens)
            if kind == "cancel":  # the client gives up before the answer: the server aborts the request
                try:
                    await asyncio.wait_for(http.post("/v1/chat/completions", json=body), self.rng.uniform(0.05, 1))
                    self.count(kind, "ok")
                except asyncio.TimeoutError:
                    self.count(kind, "ok")
                return
            if body.get("stream"):
                await self.stream(http, kind, body, arrival)
                return
            r = await http.post("/v1/chat/completions", json=body)
            if r.status_code == 200:
                out = r.json()
                why = next((p for c in out["choices"] if (p := problem(
                    kind, body, c["message"]["content"], c["finish_reason"], out.get("usage")))), None)
                self.latencies.append((arrival, time.monotonic() - self.started - arrival))
                self.judge(kind, 200, why)
            else:
                self.judge(kind, r.status_code, r.text[:160])
        except (httpx.HTTPError, KeyError, ValueError) as e:
            self.count(kind, "other", f"{type(e).__name__}: {e}"[:160])
        finally:
            self.in_flight -= 1

    async def stream(self, http: httpx.AsyncClient, kind: str, body: dict, arrival: float) -> None:
        texts, finish, usage, first, events = {}, {}, None, None, 0
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                self.judge(kind, r.status_code, (await r.aread()).decode()[:160])
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    self.judge(kind, 500 if data["error"]["type"] == "server_error" else 400, str(data)[:160])
                    return
                if first is None:  # a client that disconnects later has seen its first token all the same
                    first = time.monotonic() - self.started - arrival
                    self.ttfts.append((arrival, first))
                events += 1
                for c in data.get("choices", []):
                    texts[c["index"]] = texts.get(c["index"], "") + (c["delta"].get("content") or "")
                    finish[c["index"]] = c["finish_reason"] or finish.get(c["index"])
                usage = data.get("usage") or usage
                if kind == "disconnect" and events >= 3:  # gone mid-stream: the server must abort it
                    self.count(kind, "ok")
                    return
        why = next((p for i, t in texts.items() if (p := problem(kind, body, t, finish.get(i), usage))), None)
        if usage is None and kind != "disconnect":
            why = why or "no usage chunk"
        self.judge(kind, 200, why)

    def judge(self, kind: str, status: int, why: str | None) -> None:
        if status >= 500:
            self.count(kind, "5xx", why)
        elif status == 200:
            self.count(kind, "invalid" if why else "ok", why)
        elif kind == "hostile" and why is None:
            self.count(kind, "ok")
        else:
            self.count(kind, "4xx", why)

"""The grader of lab 05.3: the learner's `chunk_events` behind stage 05's real FastAPI app, served on loopback
(uvicorn in a thread, as the server's tests serve it) over the tiny model, read as raw bytes by a plain HTTP
client. The oracle is independent of the server: the one-request-at-a-time reference's tokens, decoded, and
OpenAI's streaming format (sse_oracle.py); a failure names the first event that breaks it.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import contextmanager

import httpx
from hypothesis import given, strategies as st

from common import SamplingParams

from .examples import hypothesis, reference
from .sse_oracle import Want, check_events, read_events

MESSAGES = [[{"role": "user", "content": "Say something."}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count: un, deux, trois"}]]


def faulty_engine(v, llm):
    """Stage 05's LocalEngine over ``llm``, whose next request's stream fails after ``after`` chunks when
    ``fault`` is set: "error" ends it with the engine's error chunk (a step raised), "raise" raises (a replica's
    connection dropped). What the stream passed on before failing is kept in ``passed``."""
    chunk_class = v.module("streams").StreamChunk

    class Failing:
        def __init__(self, stream, kind: str, after: int, passed: list):
            self.stream, self.kind, self.after, self.passed = stream, kind, after, passed
            self.request_id, self.done, self.seq = stream.request_id, stream.done, stream.seq

        async def __aiter__(self):
            async for chunk in self.stream:
                if len(self.passed) == self.after:
                    if self.kind == "raise":
                        raise ConnectionError("the stream's connection dropped (a fault the check injected)")
                    yield chunk_class("", [], "error", error="engine error: RuntimeError: a fault the check injected")
                    return
                self.passed.append(chunk)
                yield chunk

    class Faulty(v.module("server/backend").LocalEngine):
        fault: tuple[str, int] | None = None
        passed: list = []

        async def submit(self, prompt_ids, params):
            stream = await super().submit(prompt_ids, params)
            return stream if self.fault is None else Failing(stream, *self.fault, self.passed)

    return Faulty(llm)


class Recorder:
    """The app, keeping what it raised: an exception in the learner's generator reaches uvicorn, which can only
    drop the connection; the check raises it again, with its line in the learner's code."""

    def __init__(self, app):
        self.app, self.errors = app, []

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        except BaseException as e:
            while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
                e = e.exceptions[0]
            self.errors.append(e)
            raise


@contextmanager
def served(v):
    """(base URL, engine, recorder): the variant's stage-05 app over the tiny model on a free loopback port."""
    import uvicorn
    llm = v.module("engine").LLM("tiny", dtype="bfloat16", max_num_seqs=4)
    engine = faulty_engine(v, llm)
    recorder = Recorder(v.module("server/app").create_app(engine, "tiny"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(recorder, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    quiet = logging.getLogger("stepwise.server")  # the error scenarios' tracebacks are expected: not printed
    was = quiet.disabled
    quiet.disabled = True
    thread.start()
    try:
        deadline = time.perf_counter() + 20
        while not server.started and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert server.started, "stage 05's server did not start within 20 s"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine, recorder
    finally:
        server.should_exit = True
        thread.join(10)
        llm.shutdown()
        quiet.disabled = was


def post(url: str, recorder: Recorder, path: str, body: dict) -> str:
    """The raw body of a streaming request; what the learner's code raised, if it did."""
    recorder.errors.clear()
    try:
        r = httpx.post(url + path, json=body, timeout=30)
    except httpx.TimeoutException:
        raise AssertionError(f"POST {path} {body}: no byte came for 30 s (is data: [DONE] sent?)") from None
    except httpx.HTTPError as e:
        if recorder.errors:
            raise recorder.errors[0] from None
        raise AssertionError(f"POST {path} {body}: the connection broke before the stream ended ({e})") from None
    if recorder.errors:
        raise recorder.errors[0]
    assert r.status_code == 200, f"POST {path} {body}: HTTP {r.status_code}: {r.text[:300]}"
    return r.text


def run(server, body: dict, fault: tuple[str, int] | None = None, logprobs: bool = False) -> None:
    """POST ``body`` (a streaming request), check its events against the reference (or, with ``fault``, against
    what the failing stream passed on before its failure)."""
    url, engine, recorder = server
    chat = "messages" in body
    tok = reference().tokenizer
    ids = tok.encode_chat(body["messages"]) if chat else body["prompt"]
    params = SamplingParams(max_tokens=body["max_tokens"], temperature=body["temperature"], seed=body.get("seed"),
                            ignore_eos=body.get("ignore_eos", False), n=body.get("n", 1))
    expected = [reference().generate([ids], params.for_sample(i))[0] for i in range(params.n)]
    echo = tok.decode(ids) if body.get("echo") else ""
    include_usage = bool(body.get("stream_options", {}).get("include_usage"))
    engine.fault, engine.passed[:] = fault, []
    try:
        raw = post(url, recorder, "/v1/chat/completions" if chat else "/v1/completions", body)
    finally:
        engine.fault = None
    want = Want(chat, [echo + e.text for e in expected], [e.finish_reason for e in expected], len(ids),
                sum(len(e.token_ids) for e in expected), include_usage,
                logprobs=[len(ids) * bool(echo) + len(e.token_ids) for e in expected] if logprobs else None)
    if fault is not None:
        shown = "".join(c.text for c in engine.passed)
        want.error = "internal server error" if fault[0] == "raise" else "engine error: RuntimeError"
        want.texts, want.finish = [echo + shown], [None]
    check_events(read_events(raw, body), want, body)


def completion(prompt: list[int], max_tokens: int, **fields) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True} | fields


def chat(messages: list[dict], max_tokens: int, **fields) -> dict:
    return {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True} | fields


USAGE = {"stream_options": {"include_usage": True}}


@st.composite
def requests(draw) -> dict:
    n, greedy = draw(st.integers(1, 3)), draw(st.booleans())
    fields = {"n": n, "temperature": 0.0 if greedy else 0.8, "ignore_eos": draw(st.booleans())}
    if not greedy:
        fields["seed"] = draw(st.integers(0, 2**31))
    fields |= draw(st.sampled_from([{}, {"stream_options": {"include_usage": False}}, USAGE]))
    max_tokens = draw(st.integers(1, 10))
    if draw(st.booleans()):
        return chat(draw(st.sampled_from(MESSAGES)), max_tokens, **fields)
    return completion(draw(st.lists(st.integers(3, 1023), min_size=1, max_size=12)), max_tokens, **fields)


def check_05_3(v) -> None:
    with served(v) as server:
        run(server, completion([17, 99, 5, 301], 12, **USAGE))  # text chunks, the finish, then the usage chunk
        run(server, chat(MESSAGES[1], 8, n=2, temperature=0.8, seed=7, **USAGE))  # role first; two choices' usage
        run(server, completion([40, 41, 42], 10, logprobs=1, echo=True, ignore_eos=True), logprobs=True)
        run(server, completion([8, 9, 10], 8, ignore_eos=True, **USAGE), fault=("error", 2))  # the engine failed
        run(server, chat(MESSAGES[0], 8, ignore_eos=True), fault=("raise", 3))  # the stream raised

        @hypothesis(6)
        @given(body=requests())
        def any_request(body):
            run(server, body)

        any_request()

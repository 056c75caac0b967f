"""An OpenAI-compatible HTTP server over the streaming engine (FastAPI + uvicorn).

POST /v1/completions and /v1/chat/completions, with or without ``"stream": true``
(server-sent events: ``data: {json}`` chunks, then ``data: [DONE]``); GET /v1/models,
/health and /metrics (Prometheus text). Every error is OpenAI's error object: a bad
request gets a 4xx naming the field (`protocol`), a full queue or a shutdown 503, an
unexpected exception 500 (on a stream: an error event, then ``[DONE]``). A request
whose client goes away, streaming or not, is aborted: its blocks return at the next step.
The engine is an `LLM` in this process or anything with `backend.LocalEngine`'s methods
(the cluster's gateway to replicas on Ray Serve).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from common.validate import clip

from .backend import LocalEngine
from ..engine import LLM, QueueFull, RequestStream, StreamChunk
from .errors import AnswerErrorsRoute, APIError, install_error_handlers
from .events import chunk_events, merged
from .guards import DEFAULT_MAX_BODY_BYTES, Guards
from .protocol import ChatCompletionRequest, CompletionRequest, parse_request, sampling_params
from .responses import (ClosingStream, choice, ended_early, joined, logprobs_object, prediction_details, usage,
                        with_details)
from .drain import Drain


def create_app(llm, model_name: str = "smollm2-135m", *, api_key: str | None = None, docs: bool = False,
               allowed_origins: tuple[str, ...] = (), max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    engine = LocalEngine(llm) if isinstance(llm, LLM) else llm
    guards, drain = Guards(api_key, allowed_origins, max_body_bytes), Drain(engine)
    app = FastAPI(title="stepwise", version="0.1.0", lifespan=drain.lifespan,
                  dependencies=[Depends(guards.check_origin)], docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None)
    app.state.drain = drain
    app.router.route_class = AnswerErrorsRoute
    install_error_handlers(app)
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(guards.check_api_key)], route_class=AnswerErrorsRoute)

    async def read(request: Request, model: type):
        req = parse_request(await guards.read_body(request), model)
        if req.model not in (model_name, None):
            raise APIError(404, f"the model {clip(req.model)} does not exist; this server serves {model_name!r}",
                           "model", code="model_not_found")
        return req

    async def submit(ids: list[int], params) -> list[RequestStream]:
        """The request's streams: one per sample (n). An engine without `submit_samples` (the cluster) gets the n
        samples as requests of their own, sample i with seed + i: the same tokens, without shared blocks."""
        if drain.closing:
            raise APIError(503, "the server is shutting down", kind="server_overloaded")
        streams: list[RequestStream] = []
        try:
            if params.n == 1 or not hasattr(engine, "submit_samples"):
                for i in range(params.n):
                    streams.append(await engine.submit(ids, params.for_sample(i) if params.n > 1 else params))
            else:
                streams = await engine.submit_samples(ids, params)
        except (QueueFull, ValueError) as e:
            for stream in streams:  # the samples already submitted go too
                engine.abort(stream.request_id)
            if isinstance(e, QueueFull):
                raise APIError(503, str(e), kind="server_overloaded") from None
            raise APIError(400, str(e).replace("SamplingParams.", ""), getattr(e, "param", None)) from None
        drain.active.update(stream.request_id for stream in streams)
        return streams

    def logprobs_of(stream: RequestStream, start: int, count: int, chat: bool, offset: int = 0) -> dict | None:
        """The log-probabilities of the stream's output tokens [start, start + count), when it asked for them."""
        seq = getattr(stream, "seq", None)  # a cluster's RemoteStream has none: the gateway serves no logprobs
        if seq is None or seq.params.logprobs is None:
            return None
        return logprobs_object(engine.tokenizer, seq.output_token_ids[start:start + count],
                               seq.logprobs[start:start + count], chat, offset)

    async def respond(request: Request, req, ids: list[int], chat: bool):
        params = sampling_params(req, chat, len(ids), engine.max_model_len)
        if params.logprobs is not None and not isinstance(engine, LocalEngine):
            raise APIError(400, "logprobs are served by a single engine, not through the cluster's gateway",
                           "top_logprobs" if chat else "logprobs")
        streams = await submit(ids, params)
        stream = streams[0]
        echo, echo_lp = "", None  # completions' echo: the prompt's text (and log-probabilities) come first
        if not chat and req.echo:
            echo = req.prompt if isinstance(req.prompt, str) else engine.tokenizer.decode(ids)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": model_name}

        headers = getattr(stream, "headers", {})  # the cluster names the replica that serves the request
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return ClosingStream(stream_events(streams, head | {"object": head["object"] + ".chunk" * chat}, chat,
                                               include_usage, echo, ids),
                                 on_close=lambda: [finish(s) for s in streams], headers=headers)
        per_sample = await collect(request, streams)
        if per_sample is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        choices = []
        for i, chunks in enumerate(per_sample):
            last, text = chunks[-1], "".join(c.text for c in chunks)
            if last.finish_reason in ("abort", "error"):
                raise ended_early(last)
            if echo:
                echo_lp = prompt_logprobs_of(streams[i], ids)
            lp = logprobs_of(streams[i], 0, sum(len(c.token_ids) for c in chunks), chat,
                             echo_lp["text_offset"][-1] + len(echo_lp["tokens"][-1]) if echo_lp else 0)
            choices.append({"index": i, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                            "finish_reason": last.finish_reason} if chat else choice(chat, echo + text,
                                                                                      last.finish_reason, index=i,
                                                                                      logprobs=joined(echo_lp, lp)))
        tokens = sum(len(c.token_ids) for chunks in per_sample for c in chunks)
        return JSONResponse(head | {"choices": choices, "usage": usage(len(ids), tokens, prediction_details(streams))},
                            headers=headers)

    def prompt_logprobs_of(stream: RequestStream, ids: list[int]) -> dict | None:
        seq = getattr(stream, "seq", None)
        if seq is None or seq.params.prompt_logprobs is None:
            return None
        return logprobs_object(engine.tokenizer, ids, seq.prompt_logprobs, False)

    async def annotated(streams: list[RequestStream], chat: bool, echo: str, ids: list[int]):
        """The samples' chunks as they come, each with its log-probabilities (when asked for); an echoed prompt
        (completions) is each choice's first chunk."""
        seen, offsets = [0] * len(streams), [0] * len(streams)  # per sample: tokens and characters sent
        echoed: set[int] = set()
        async with aclosing(merged(streams)) as chunks:
            async for i, chunk in chunks:
                if echo and i not in echoed and chunk.finish_reason not in ("abort", "error"):
                    echoed.add(i)
                    echo_lp = prompt_logprobs_of(streams[i], ids)
                    yield i, StreamChunk(echo, []), echo_lp
                    if echo_lp:
                        offsets[i] = echo_lp["text_offset"][-1] + len(echo_lp["tokens"][-1])
                lp = logprobs_of(streams[i], seen[i], len(chunk.token_ids), chat, offsets[i]) \
                    if chunk.token_ids else None
                seen[i] += len(chunk.token_ids)
                if lp and not chat:  # the legacy text_offset counts the tokens' own texts, as unstreamed
                    offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
                yield i, chunk, lp

    async def stream_events(streams: list[RequestStream], head: dict, chat: bool, include_usage: bool, echo: str,
                            ids: list[int]):
        """The response body of a streaming request: `chunk_events` (events.py) over the annotated chunks."""
        async with aclosing(annotated(streams, chat, echo, ids)) as chunks:  # closed: its readers stop
            async for event in chunk_events(chunks, head, chat, include_usage, len(ids)):
                yield with_details(event, prediction_details(streams)) if include_usage else event

    async def collect(request: Request, streams: list[RequestStream]):
        """A non-streaming request's chunks, per sample; None if its client disconnected first (it is aborted)."""
        chunks: list[list] = [[] for _ in streams]

        async def read_all():
            for i, stream in enumerate(streams):  # the others' chunks wait in their queues meanwhile
                async for chunk in stream:
                    chunks[i].append(chunk)

        reader, gone = asyncio.ensure_future(read_all()), asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({reader, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            reader.cancel()  # a no-op when it finished
            for stream in streams:
                finish(stream)
        if not reader.done() or reader.cancelled():
            return None
        reader.result()  # raises what the reader raised
        return chunks

    def finish(stream: RequestStream) -> None:
        """The request is answered or its client gone: if it still runs, abort it (its blocks return next step)."""
        if not stream.done.is_set():
            engine.abort(stream.request_id)
        drain.active.discard(stream.request_id)

    @v1.post("/completions")
    async def completions(request: Request):
        req = await read(request, CompletionRequest)
        ids = req.prompt if isinstance(req.prompt, list) else engine.tokenizer.encode(req.prompt)
        return await respond(request, req, ids, chat=False)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        req = await read(request, ChatCompletionRequest)
        ids = engine.tokenizer.encode_chat([{"role": m.role, "content": m.content} for m in req.messages])
        return await respond(request, req, ids, chat=True)

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "stepwise", "max_model_len": engine.max_model_len}]}

    @app.get("/health")
    async def health():
        status, details = await engine.health()
        status = "shutting down" if drain.closing and status in ("ok", "degraded") else status
        return JSONResponse({"status": status} | details, status_code=200 if status in ("ok", "degraded") else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(await engine.metrics(), media_type="text/plain; version=0.0.4")

    app.include_router(v1)
    return app


async def disconnected(request: Request) -> None:
    """Return when the client closes its connection (the body is already read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)

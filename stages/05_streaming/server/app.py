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

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from common.validate import clip

from .backend import LocalEngine
from ..engine import LLM, QueueFull, RequestStream
from .errors import AnswerErrorsRoute, APIError, install_error_handlers, internal_error, log
from .guards import DEFAULT_MAX_BODY_BYTES, Guards
from .protocol import ChatCompletionRequest, CompletionRequest, parse_request, sampling_params
from .responses import ClosingStream, choice, ended_early, sse
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

    async def submit(ids: list[int], params) -> RequestStream:
        if drain.closing:
            raise APIError(503, "the server is shutting down", kind="server_overloaded")
        try:
            stream = await engine.submit(ids, params)
        except QueueFull as e:
            raise APIError(503, str(e), kind="server_overloaded") from None
        except ValueError as e:
            raise APIError(400, str(e).replace("SamplingParams.", ""), getattr(e, "param", None)) from None
        drain.active.add(stream.request_id)
        return stream

    async def respond(request: Request, req, ids: list[int], chat: bool):
        stream = await submit(ids, sampling_params(req, chat, len(ids), engine.max_model_len))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": model_name}

        def usage(completion_tokens: int) -> dict:
            n = len(ids)
            return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}

        headers = getattr(stream, "headers", {})  # the cluster names the replica that serves the request
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return ClosingStream(events(stream, head | {"object": head["object"] + ".chunk" * chat}, chat,
                                        usage if include_usage else None), on_close=lambda: finish(stream),
                                 headers=headers)
        chunks = await collect(request, stream)
        if chunks is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        last, text, tokens = chunks[-1], "".join(c.text for c in chunks), sum(len(c.token_ids) for c in chunks)
        if last.finish_reason in ("abort", "error"):
            raise ended_early(last)
        c = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": last.finish_reason} if chat else choice(chat, text, last.finish_reason))
        return JSONResponse(head | {"choices": [c], "usage": usage(tokens)}, headers=headers)

    async def events(stream: RequestStream, head: dict, chat: bool, usage):
        first, tokens = True, 0
        try:
            async for chunk in stream:
                tokens += len(chunk.token_ids)
                if chunk.finish_reason in ("abort", "error"):
                    yield sse(ended_early(chunk).body())
                    break
                if chunk.text or chunk.finish_reason or first:
                    data = head | {"choices": [choice(chat, chunk.text, chunk.finish_reason, first)]}
                    if chunk.finish_reason and usage is not None:
                        data["usage"] = usage(tokens)
                    yield sse(data)
                    first = False
        except Exception as e:  # noqa: BLE001 - never cut a stream: say what happened, then end it
            log.exception("stream failed")
            yield sse(internal_error(e).body())
        yield "data: [DONE]\n\n"

    async def collect(request: Request, stream: RequestStream):
        """A non-streaming request's chunks; None if its client disconnected first (the request is aborted)."""
        chunks = []

        async def read_all():
            async for chunk in stream:
                chunks.append(chunk)

        reader, gone = asyncio.ensure_future(read_all()), asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({reader, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            reader.cancel()  # a no-op when it finished
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

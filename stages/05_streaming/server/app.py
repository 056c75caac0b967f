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

import time
import uuid
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from common.paths import DEFAULT_MODEL
from common.validate import clip
from stages.xray.live import add_xray_routes

from .backend import LocalEngine
from ..engine import LLM, QueueFull, RequestStream
from ..front import HeldFrontEnd
from .answers import collect, stream_events, whole_choice
from .errors import AnswerErrorsRoute, APIError, install_error_handlers
from .guards import DEFAULT_MAX_BODY_BYTES, Guards
from .params import sampling_params
from .protocol import ChatCompletionRequest, CompletionRequest, parse_request
from .responses import ClosingStream, prediction_details, usage
from .drain import Drain


@dataclass
class Api:
    """What every handler reads: the engine (`backend.LocalEngine`'s methods), the model's name, the guards a
    request passes and the drain that tracks requests in flight. One per app, at ``app.state.api``."""
    engine: object
    model_name: str
    guards: Guards
    drain: Drain


def create_app(llm, model_name: str = DEFAULT_MODEL, *, api_key: str | None = None, docs: bool = False,
               allowed_origins: tuple[str, ...] = (), max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               xray: bool = True) -> FastAPI:
    engine = LocalEngine(llm) if isinstance(llm, (LLM, HeldFrontEnd)) else llm  # else a cluster's gateway
    api = Api(engine, model_name, Guards(api_key, allowed_origins, max_body_bytes), Drain(engine))
    app = FastAPI(title="stepwise", version="0.1.0", lifespan=api.drain.lifespan,
                  dependencies=[Depends(api.guards.check_origin)], docs_url="/docs" if docs else None,
                  redoc_url=None, openapi_url="/openapi.json" if docs else None)
    app.state.api, app.state.drain = api, api.drain
    app.router.route_class = AnswerErrorsRoute
    install_error_handlers(app)
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(api.guards.check_api_key)], route_class=AnswerErrorsRoute)
    v1.add_api_route("/completions", completions, methods=["POST"])
    v1.add_api_route("/chat/completions", chat_completions, methods=["POST"])
    v1.add_api_route("/models", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.include_router(v1)
    if xray and isinstance(engine, LocalEngine):  # the live X-ray at /xray (stages/xray/live.py)
        add_xray_routes(app, engine.llm, api.guards.check_api_key if api.guards.api_key else None)
    return app


# ---- the routes ----------------------------------------------------------------------------------------------------
async def completions(request: Request):
    api: Api = request.app.state.api
    req = await read(api, request, CompletionRequest)
    ids = req.prompt if isinstance(req.prompt, list) else await prepare(api, api.engine.tokenizer.encode, req.prompt)
    return await respond(api, request, req, ids, chat=False)


async def chat_completions(request: Request):
    api: Api = request.app.state.api
    req = await read(api, request, ChatCompletionRequest)
    ids = await prepare(api, api.engine.tokenizer.encode_chat,
                        [{"role": m.role, "content": m.content} for m in req.messages])
    return await respond(api, request, req, ids, chat=True)


async def models(request: Request):
    api: Api = request.app.state.api
    return {"object": "list", "data": [{"id": api.model_name, "object": "model", "created": 0,
                                        "owned_by": "stepwise", "max_model_len": api.engine.max_model_len}]}


async def health(request: Request):
    api: Api = request.app.state.api
    status, details = await api.engine.health()
    status = "shutting down" if api.drain.closing and status in ("ok", "degraded") else status
    return JSONResponse({"status": status} | details, status_code=200 if status in ("ok", "degraded") else 503)


async def metrics(request: Request):
    return PlainTextResponse(await request.app.state.api.engine.metrics(), media_type="text/plain; version=0.0.4")


# ---- a request: read, submit, answer ------------------------------------------------------------------------------
async def read(api: Api, request: Request, model: type):
    req = parse_request(await api.guards.read_body(request), model)
    if req.model not in (api.model_name, None):
        raise APIError(404, f"the model {clip(req.model)} does not exist; this server serves {api.model_name!r}",
                       "model", code="model_not_found")
    return req


async def prepare(api: Api, fn, *args):
    """A prompt's tokenization on the engine's worker threads where it has them (`LocalEngine.prepare`): a long
    prompt must not hold the event loop that streams every other request's tokens."""
    if hasattr(api.engine, "prepare"):
        return await api.engine.prepare(fn, *args)
    return fn(*args)


async def submit(api: Api, ids: list[int], params) -> list[RequestStream]:
    """The request's streams: one per sample (n). An engine without `submit_samples` (the cluster) gets the n
    samples as requests of their own, sample i with seed + i: the same tokens, without shared blocks."""
    if api.drain.closing:
        raise APIError(503, "the server is shutting down", kind="server_overloaded")
    engine, streams = api.engine, []
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
    api.drain.active.update(stream.request_id for stream in streams)
    return streams


def finish(api: Api, stream: RequestStream) -> None:
    """The request is answered or its client gone: if it still runs, abort it (its blocks return next step)."""
    if not stream.done.is_set():
        api.engine.abort(stream.request_id)
    api.drain.active.discard(stream.request_id)


async def respond(api: Api, request: Request, req, ids: list[int], chat: bool):
    params = sampling_params(req, chat, len(ids), api.engine.max_model_len)
    if params.logprobs is not None and not isinstance(api.engine, LocalEngine):
        raise APIError(400, "logprobs are served by a single engine, not through the cluster's gateway",
                       "top_logprobs" if chat else "logprobs")
    try:
        streams = await submit(api, ids, params)
    except APIError as e:  # a constraint refused when the request was prepared: named as the client sent it
        if e.param == "structured_outputs" and getattr(req, "structured_outputs", None) is None:
            e = APIError(e.status, e.message.replace("structured_outputs", "response_format"), "response_format")
        raise e from None
    echo = ""  # completions' echo: the prompt's text (and log-probabilities) come first
    if not chat and req.echo:
        echo = req.prompt if isinstance(req.prompt, str) else api.engine.tokenizer.decode(ids)
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": api.model_name}
    headers = getattr(streams[0], "headers", {})  # the cluster names the replica that serves the request
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        events = stream_events(api.engine.tokenizer, streams, head | {"object": head["object"] + ".chunk" * chat}, chat,
                               include_usage, echo, ids)
        return ClosingStream(events, on_close=lambda: [finish(api, s) for s in streams], headers=headers)
    try:
        per_sample = await collect(request, streams)
    finally:
        for stream in streams:
            finish(api, stream)
    if per_sample is None:  # the client went away; nobody reads this
        return Response(status_code=499)
    choices = [whole_choice(api.engine.tokenizer, i, chunks, streams[i], chat, echo, ids)
               for i, chunks in enumerate(per_sample)]
    tokens = sum(len(c.token_ids) for chunks in per_sample for c in chunks)
    return JSONResponse(head | {"choices": choices, "usage": usage(len(ids), tokens, prediction_details(streams))},
                        headers=headers)

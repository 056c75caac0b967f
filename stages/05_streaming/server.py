"""An OpenAI-compatible HTTP server over the streaming engine (FastAPI + uvicorn).

POST /v1/completions and /v1/chat/completions, with or without ``"stream": true``
(server-sent events: ``data: {json}`` chunks, then ``data: [DONE]``); GET /v1/models,
/health and /metrics (Prometheus text). Invalid requests get OpenAI's error object
and a 4xx status; a full waiting queue gets 503. Nothing a client sends can stop
the engine loop, which runs in its own thread.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from common.sampling import SamplingParams

from .engine import LLM, QueueFull


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code


def error_response(e: APIError) -> JSONResponse:
    body = {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code}}
    return JSONResponse(body, status_code=e.status)


SAMPLING_FIELDS = {"temperature": float, "top_p": float, "top_k": int, "seed": int, "stop_token_ids": list,
                   "ignore_eos": bool}


def sampling_params(body: dict, chat: bool) -> SamplingParams:
    """OpenAI request fields -> SamplingParams; a bad value raises APIError naming the field."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens", 16)
    kwargs = {"max_tokens": 256 if max_tokens is None else max_tokens, "stop": body.get("stop") or []}
    if body.get("n", 1) != 1:
        raise APIError(400, "only n=1 is supported", "n")
    for name in SAMPLING_FIELDS:
        if body.get(name) is not None:
            kwargs[name] = body[name]
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        param = next((f for f in ("max_tokens", "stop", *SAMPLING_FIELDS) if f in str(e)), None)
        raise APIError(400, str(e).replace("SamplingParams.", ""), param) from None


def create_app(llm: LLM, model_name: str = "smollm2-135m") -> FastAPI:
    app = FastAPI(title="stepwise", version="0.1.0")

    @app.exception_handler(APIError)
    async def api_error(_, e: APIError):
        return error_response(e)

    async def read_body(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        if body.get("model") not in (model_name, None):
            raise APIError(404, f"the model {body.get('model')!r} does not exist; this server serves {model_name!r}",
                           "model", "invalid_request_error", "model_not_found")
        return body

    def submit(prompt, params: SamplingParams):
        try:
            return llm.add_request(prompt, params, loop=asyncio.get_running_loop())
        except QueueFull as e:
            raise APIError(503, str(e), kind="server_overloaded") from None
        except ValueError as e:
            raise APIError(400, str(e), "prompt" if "prompt" in str(e) else None) from None

    async def respond(body: dict, prompt, chat: bool):
        params = sampling_params(body, chat)
        stream = submit(prompt, params)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: str, finish, first: bool = False) -> dict:
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

        def usage(completion_tokens: int) -> dict:
            n = stream.seq.num_prompt_tokens
            return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}

        if body.get("stream"):
            async def events():
                first, tokens = True, 0
                try:
                    async for chunk in stream:
                        tokens += len(chunk.token_ids)
                        if chunk.error:
                            yield f"data: {json.dumps({'error': {'message': chunk.error, 'type': 'server_error'}})}\n\n"
                            break
                        finish = api_finish(chunk.finish_reason)
                        if chunk.text or finish or first:
                            data = {"id": rid, "object": obj + ("" if not chat else ".chunk"), "created": created,
                                    "model": model_name, "choices": [choice(chunk.text, finish, first)]}
                            if finish and (body.get("stream_options") or {}).get("include_usage"):
                                data["usage"] = usage(tokens)
                            yield f"data: {json.dumps(data)}\n\n"
                            first = False
                    yield "data: [DONE]\n\n"
                finally:  # the client went away (or we are done): free its blocks at the next step
                    if not stream.done.is_set():
                        llm.abort(stream.request_id)
            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        text, tokens, finish, error = [], 0, None, None
        try:
            async for chunk in stream:
                text.append(chunk.text)
                tokens += len(chunk.token_ids)
                finish, error = chunk.finish_reason, chunk.error
        finally:
            if not stream.done.is_set():
                llm.abort(stream.request_id)
        if error:
            raise APIError(500, error, kind="server_error")
        out = "".join(text)
        c = ({"index": 0, "message": {"role": "assistant", "content": out}, "logprobs": None,
              "finish_reason": api_finish(finish)} if chat else choice(out, api_finish(finish)))
        return {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [c],
                "usage": usage(tokens)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
            raise APIError(400, "'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")
        return await respond(body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise APIError(400, "'messages' must be a non-empty list of {role, content} objects with string content",
                           "messages")
        return await respond(body, llm.tokenizer.apply_chat_template(messages), chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "stepwise", "max_model_len": llm.max_model_len}]}

    @app.get("/health")
    async def health():
        alive = llm._thread is None or llm._thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "engine stopped"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics():
        bm, st = llm.block_manager, llm.stats
        gauges = {
            "stepwise_requests_waiting": (len(llm.scheduler.waiting) + llm._inbox.qsize(), "Requests waiting"),
            "stepwise_requests_running": (len(llm.scheduler.running), "Requests running"),
            "stepwise_kv_blocks_used": (bm.num_used_blocks, "KV blocks held by requests"),
            "stepwise_kv_blocks_free": (bm.num_free_blocks, "KV blocks free (cached ones included)"),
            "stepwise_kv_cache_usage_ratio": (bm.num_used_blocks / bm.num_blocks, "Share of KV blocks in use"),
            "stepwise_prefix_cache_hit_rate": (bm.hit_tokens / bm.queried_tokens if bm.queried_tokens else 0.0,
                                               "Prompt tokens found in the prefix cache / looked up"),
            "stepwise_preemptions": (st.preemptions, "Preemptions since the counters were reset"),
        }
        return PlainTextResponse(llm.metrics.render(gauges), media_type="text/plain; version=0.0.4")

    return app


def api_finish(reason: str | None) -> str | None:
    return {"abort": "stop"}.get(reason, reason)


def serve(llm: LLM, host: str = "127.0.0.1", port: int = 8000, model_name: str = "smollm2-135m") -> None:
    import uvicorn
    uvicorn.run(create_app(llm, model_name), host=host, port=port, log_level="info")

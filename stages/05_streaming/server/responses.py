"""What the server sends: OpenAI's choice objects, server-sent events, and a request's early end."""
from __future__ import annotations

import json

from fastapi.responses import StreamingResponse

from .errors import APIError


def choice(chat: bool, text: str, finish: str | None, first: bool = False, index: int = 0,
           logprobs: dict | None = None) -> dict:
    if not chat:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def logprobs_object(tokenizer, ids: list[int], entries: list, chat: bool, text_offset: int = 0) -> dict:
    """OpenAI's shapes for tokens ``ids`` and their (log-probability, top [(id, log-probability)]) entries: chat's
    ``{"content": [{token, logprob, bytes, top_logprobs}]}``, the legacy completions' parallel lists. A token's
    text is its own decoding (a piece of a character decodes to U+FFFD; ``bytes`` are that text's)."""
    def text(t: int) -> str:
        return tokenizer.decode([t], skip_special_tokens=False)

    entries = [None if e is None else (finite(e[0]), [(i, finite(v)) for i, v in e[1]]) for e in entries]
    if chat:
        return {"content": [{"token": text(t), "logprob": lp, "bytes": list(text(t).encode()),
                             "top_logprobs": [{"token": text(i), "logprob": v, "bytes": list(text(i).encode())}
                                              for i, v in top]} for t, (lp, top) in zip(ids, entries)]}
    offsets, at = [], text_offset
    for t in ids:
        offsets.append(at)
        at += len(text(t))
    # An echoed prompt's first token has no log-probability: None, as in OpenAI's answer.
    return {"tokens": [text(t) for t in ids], "token_logprobs": [None if e is None else e[0] for e in entries],
            "top_logprobs": [None if e is None else {text(i): v for i, v in e[1]} for e in entries],
            "text_offset": offsets}


def finite(logprob: float) -> float:
    """JSON has no -inf: a token a mask ruled out (stage 07's processed logprobs) is sent as -9999.0, as vLLM does."""
    return max(logprob, -9999.0)


def joined(a: dict | None, b: dict | None) -> dict | None:
    """Two legacy logprobs objects one after the other (an echoed prompt's, then the completion's)."""
    if a is None or b is None:
        return a or b
    return {k: a[k] + b[k] for k in a}


class ClosingStream(StreamingResponse):
    """Server-sent events that call ``on_close`` however they end: finished, the client gone (even before the
    first event, when the generator never started), or cancelled; the request then leaves the engine."""

    def __init__(self, content, on_close, headers: dict | None = None):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"} | (headers or {}))
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def sse(data: dict) -> str:
    """One server-sent event: a ``data:`` line and the blank line that ends the event."""
    return f"data: {json.dumps(data)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int, details: dict | None = None) -> dict:
    """OpenAI's usage object; ``details``: its completion_tokens_details (predicted outputs' counts)."""
    counts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
              "total_tokens": prompt_tokens + completion_tokens}
    return counts | ({"completion_tokens_details": details} if details is not None else {})


def prediction_details(streams) -> dict | None:
    """With a predicted output (chat's ``prediction``): OpenAI's accepted_prediction_tokens, "tokens in the
    prediction that appeared in the completion", here its drafts the answer kept, and rejected_prediction_tokens,
    its drafts rejected (billed, as OpenAI's are; a part never drafted is in neither). Drafts of the method's
    proposer, after the prediction is lost, count in neither. Summed over the n samples; None without a prediction,
    or where the engine's sequences are out of reach (the cluster)."""
    seqs = [getattr(stream, "seq", None) for stream in streams]
    if not seqs or None in seqs or seqs[0].params.prediction is None:
        return None
    accepted = sum(seq.num_accepted_tokens for seq in seqs)
    return {"accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(seq.num_drafted_tokens for seq in seqs) - accepted}


def with_details(event: str, details) -> str:
    """A streamed usage chunk (``choices: []``) with completion_tokens_details (``details()``, asked for only on
    that chunk) added; other events unchanged."""
    if not event.startswith('data: {') or '"usage": {' not in event:
        return event
    data = json.loads(event[len("data: "):])
    found = details() if data.get("choices") == [] and "usage" in data else None
    if found is None:
        return event
    data["usage"]["completion_tokens_details"] = found
    return sse(data)


def ended_early(chunk) -> APIError:
    """The request was aborted (the server is shutting down), ended by its own rules (its constraint allowed no
    token at some position: the request's fault, a 400 however far it got) or failed in the engine (a 500)."""
    if chunk.finish_reason == "abort":
        return APIError(503, "the server is shutting down; the request was stopped", kind="server_overloaded")
    if getattr(chunk, "rejected", False):
        return APIError(400, chunk.error, "structured_outputs")
    return APIError(500, chunk.error or "the engine failed", kind="server_error")

"""A request's streams read into what the server sends: a whole answer's choices, or a streamed answer's chunks
with their log-probabilities (the echoed prompt first), and the moment a client goes away."""
from __future__ import annotations

import asyncio
from contextlib import aclosing

from fastapi import Request

from ..engine import RequestStream, StreamChunk
from .events import chunk_events, merged
from .responses import choice, ended_early, joined, logprobs_object, prediction_details, with_details


def whole_choice(tokenizer, index: int, chunks: list[StreamChunk], stream: RequestStream, chat: bool, echo: str,
                 ids: list[int]) -> dict:
    """One sample of a non-streaming answer: its text (after the echoed prompt), finish reason and log-probs."""
    last, text = chunks[-1], "".join(c.text for c in chunks)
    if last.finish_reason in ("abort", "error"):
        raise ended_early(last)
    echo_lp = prompt_logprobs_of(tokenizer, stream, ids) if echo else None
    lp = logprobs_of(tokenizer, stream, 0, sum(len(c.token_ids) for c in chunks), chat,
                     echo_lp["text_offset"][-1] + len(echo_lp["tokens"][-1]) if echo_lp else 0)
    if chat:
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                "finish_reason": last.finish_reason}
    return choice(chat, echo + text, last.finish_reason, index=index, logprobs=joined(echo_lp, lp))


def logprobs_of(tokenizer, stream: RequestStream, start: int, count: int, chat: bool, offset: int = 0) -> dict | None:
    """The log-probabilities of the stream's output tokens [start, start + count), when it asked for them."""
    seq = getattr(stream, "seq", None)  # a cluster's RemoteStream has none: the gateway serves no logprobs
    if seq is None or seq.params.logprobs is None:
        return None
    return logprobs_object(tokenizer, seq.output_token_ids[start:start + count],
                           seq.logprobs[start:start + count], chat, offset)


def prompt_logprobs_of(tokenizer, stream: RequestStream, ids: list[int]) -> dict | None:
    seq = getattr(stream, "seq", None)
    if seq is None or seq.params.prompt_logprobs is None:
        return None
    return logprobs_object(tokenizer, ids, seq.prompt_logprobs, False)


async def annotated(tokenizer, streams: list[RequestStream], chat: bool, echo: str, ids: list[int]):
    """The samples' chunks as they come, each with its log-probabilities (when asked for); an echoed prompt
    (completions) is each choice's first chunk."""
    seen, offsets = [0] * len(streams), [0] * len(streams)  # per sample: tokens and characters sent
    echoed: set[int] = set()
    async with aclosing(merged(streams)) as chunks:
        async for i, chunk in chunks:
            if echo and i not in echoed and chunk.finish_reason not in ("abort", "error"):
                echoed.add(i)
                echo_lp = prompt_logprobs_of(tokenizer, streams[i], ids)
                yield i, StreamChunk(echo, []), echo_lp
                if echo_lp:
                    offsets[i] = echo_lp["text_offset"][-1] + len(echo_lp["tokens"][-1])
            lp = logprobs_of(tokenizer, streams[i], seen[i], len(chunk.token_ids), chat, offsets[i]) \
                if chunk.token_ids else None
            seen[i] += len(chunk.token_ids)
            if lp and not chat:  # the legacy text_offset counts the tokens' own texts, as unstreamed
                offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            yield i, chunk, lp


async def stream_events(tokenizer, streams: list[RequestStream], head: dict, chat: bool, include_usage: bool,
                        echo: str, ids: list[int]):
    """The response body of a streaming request: `chunk_events` (events.py) over the annotated chunks."""
    async with aclosing(annotated(tokenizer, streams, chat, echo, ids)) as chunks:  # closed: its readers stop
        async for event in chunk_events(chunks, head, chat, include_usage, len(ids)):
            yield with_details(event, lambda: prediction_details(streams)) if include_usage else event


async def collect(request: Request, streams: list[RequestStream]):
    """A non-streaming request's chunks, per sample; None if its client disconnected first (the caller aborts
    what still runs)."""
    chunks: list[list] = [[] for _ in streams]
    reader, gone = asyncio.ensure_future(read_all(streams, chunks)), asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({reader, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        reader.cancel()  # a no-op when it finished
    if not reader.done() or reader.cancelled():
        return None
    reader.result()  # raises what the reader raised
    return chunks


async def read_all(streams: list[RequestStream], chunks: list[list]) -> None:
    for i, stream in enumerate(streams):  # the others' chunks wait in their queues meanwhile
        async for chunk in stream:
            chunks[i].append(chunk)


async def disconnected(request: Request) -> None:
    """Return when the client closes its connection (the body is already read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)

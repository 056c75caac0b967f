"""A streaming request's answer: its samples' chunks, as they come, written as OpenAI's server-sent events.

`merged` reads the n samples' streams at once (a sample that has text must not wait for a slower one);
`chunk_events` writes what they produce as ``data: {json}`` events: one chunk object per piece of text, the
usage chunk when the client asked for it, an error event when the request cannot finish, and always
``data: [DONE]`` last, so a client never waits on a stream that quietly stopped.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

from ..streams import RequestStream, StreamChunk
from .errors import internal_error, log
from .responses import choice, ended_early, sse, usage


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, StreamChunk]]:
    """(sample index, chunk) in the order the chunks arrive; an exception a stream raised is raised here. Close it
    (``contextlib.aclosing``) to stop reading: the readers still waiting are cancelled."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream):
        try:
            async for chunk in stream:
                await queue.put((i, chunk))
        except Exception as e:  # noqa: BLE001 - handed to the reader, which reports it
            await queue.put((i, e))
        await queue.put((i, None))

    pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, chunk = await queue.get()
            if chunk is None:
                left -= 1
            elif isinstance(chunk, Exception):
                raise chunk
            else:
                yield i, chunk
    finally:
        for p in pumps:
            p.cancel()


async def chunk_events(chunks: AsyncIterator[tuple[int, StreamChunk, dict | None]], head: dict, chat: bool,
                       include_usage: bool, prompt_tokens: int) -> AsyncIterator[str]:
    """The events of one streaming request, from ``chunks``: (choice index, `StreamChunk`, its logprobs object or
    None), every sample's, as they come. Each event is ``head`` (id, object, created, model) with one choice;
    a chat choice's first event says its role. Nothing is sent for a chunk that carries no text, no finish
    reason and no logprobs (its tokens are held back), but its tokens count in the usage."""
    # lab 05.3 begin: the SSE chunk events
    announced: set[int] = set()  # the choices whose first event is out
    tokens, failed = 0, False
    try:
        async for i, chunk, logprobs in chunks:
            tokens += len(chunk.token_ids)
            if chunk.finish_reason in ("abort", "error"):  # stopped by a shutdown or an engine failure: say which
                yield sse(ended_early(chunk).body())
                failed = True
                break
            first = i not in announced
            if chunk.text or chunk.finish_reason or first or logprobs:
                yield sse(head | {"choices": [choice(chat, chunk.text, chunk.finish_reason, first, i, logprobs)]})
                announced.add(i)
        if include_usage and not failed:  # one more chunk, with no choices: the whole request's usage
            yield sse(head | {"choices": [], "usage": usage(prompt_tokens, tokens)})
    except Exception as e:  # noqa: BLE001 - never cut a stream: say what happened, then end it
        log.exception("stream failed")
        yield sse(internal_error(e).body())
    yield "data: [DONE]\n\n"
    # lab 05.3 end

"""What a caller holds while its request runs: a stream of chunks, the last with a finish reason."""
from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from common.sequence import RequestMetrics, Sequence


class QueueFull(Exception):
    """Too many requests are waiting; the caller should retry later (HTTP 503)."""


@dataclass
class StreamChunk:
    text: str  # new text since the previous chunk
    token_ids: list[int]  # new token ids since the previous chunk
    finish_reason: str | None = None  # set on the last chunk: "stop", "length", "abort" or "error"
    metrics: RequestMetrics | None = None  # on the last chunk
    error: str | None = None


@dataclass
class RequestStream:
    """One request's chunks, in order. A synchronous reader gets them with ``next_chunk`` (which steps the
    engine when nobody else does); an asynchronous one (the server) through ``async for``."""
    request_id: str
    seq: Sequence
    next_chunk: Callable[["RequestStream"], StreamChunk] | None = None  # the engine's, for synchronous readers
    chunks: queue.Queue = field(default_factory=queue.Queue)
    loop: asyncio.AbstractEventLoop | None = None  # set for async readers (the server)
    async_chunks: asyncio.Queue | None = None
    sent_text: int = 0
    sent_tokens: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def put(self, chunk: StreamChunk) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.async_chunks.put_nowait, chunk)
        else:
            self.chunks.put(chunk)
        if chunk.finish_reason is not None:
            self.done.set()

    def __iter__(self):
        while True:
            chunk = self.next_chunk(self)
            yield chunk
            if chunk.finish_reason is not None:
                return

    async def __aiter__(self):
        while True:
            chunk = await self.async_chunks.get()
            yield chunk
            if chunk.finish_reason is not None:
                return


def stable_text_len(seq: Sequence) -> int:
    """How much of ``seq.output_text`` a stream may show now: a tail that could still grow into a stop string is
    held back (the text must end before the stop string, which may arrive over several tokens)."""
    if seq.is_finished or not seq.params.stop:
        return len(seq.output_text)
    return max(0, len(seq.output_text) - max(len(s) for s in seq.params.stop) + 1)

"""What a caller holds while its request runs: a stream of chunks, the last with a finish reason.

A stream is a plain queue the engine loop fills: a synchronous reader takes chunks from it through the loop
(`EngineLoop.read`, which steps the engine when nobody else does), an asynchronous one (the server) with
``async for``.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from contextlib import contextmanager
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
    # The request's own rules ended it (a constraint that no token can continue): the client's to fix, a 400.
    rejected: bool = False


@dataclass
class RequestStream:
    """One request's chunks, in order."""
    request_id: str
    seq: Sequence
    chunks: queue.Queue = field(default_factory=queue.Queue)  # a synchronous reader's
    loop: asyncio.AbstractEventLoop | None = None  # set for async readers (the server)
    async_chunks: asyncio.Queue | None = None
    outbox: "Outbox | None" = None  # the engine loop's, which hands async readers their chunks
    sent_text: int = 0
    sent_tokens: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def put(self, chunk: StreamChunk) -> None:
        if self.loop is not None:
            self.outbox.put(self, chunk)
        else:
            self.chunks.put(chunk)
        if chunk.finish_reason is not None:
            self.done.set()

    async def __aiter__(self):
        while True:
            chunk = await self.async_chunks.get()
            yield chunk
            if chunk.finish_reason is not None:
                return


class Outbox:
    """Chunks for asynchronous readers, held while the engine steps and then handed to each event loop in one
    call: one wake-up of the server's loop per step instead of one per streamed token (each wake-up is a write
    to the loop's self-pipe on this thread and a round of the interpreter lock between the two threads).
    A reader whose event loop has closed will never read again: ``on_reader_gone`` stops its request."""

    def __init__(self, on_reader_gone: Callable[[RequestStream], None]):
        self.on_reader_gone = on_reader_gone
        self.pending: dict[asyncio.AbstractEventLoop, list] | None = None  # None: not holding

    @contextmanager
    def holding(self):
        self.pending = {}
        try:
            yield
        finally:
            pending, self.pending = self.pending, None
            for loop, items in pending.items():
                self.send(loop, items)

    def put(self, stream: RequestStream, chunk: StreamChunk) -> None:
        """Hold the chunk for the end of the step, or hand it over now when no step is running."""
        if self.pending is not None:
            self.pending.setdefault(stream.loop, []).append((stream, chunk))
        else:
            self.send(stream.loop, [(stream, chunk)])

    def send(self, loop: asyncio.AbstractEventLoop, items: list) -> None:
        try:
            loop.call_soon_threadsafe(deliver, items)
        except RuntimeError:  # the loop is closed (its program ended without reading): nobody reads these
            for stream, chunk in items:
                if chunk.finish_reason is None:
                    self.on_reader_gone(stream)


def deliver(items: list) -> None:
    """On the event loop: the chunks one step produced, in order."""
    for stream, chunk in items:
        stream.async_chunks.put_nowait(chunk)


def stable_text_len(seq: Sequence) -> int:
    """How much of ``seq.output_text`` a stream may show now: a tail that could still grow into a stop string is
    held back (the text must end before the stop string, which may arrive over several tokens). That tail is one
    character shorter than the *longest* stop string: any shorter hold-back could show the start of a long one
    (``t@`` of ``t@@@``) that a later token completes, and ``generate()`` never returns."""
    # lab 05.2 begin: hold back a possible stop string
    if seq.is_finished or not seq.params.stop:
        return len(seq.output_text)
    return max(0, len(seq.output_text) - max(len(s) for s in seq.params.stop) + 1)
    # lab 05.2 end

"""Stage 05: the engine loop runs in the background; tokens reach the caller as soon as they exist.

Stage 04's `step()` (schedule -> run -> postprocess) now runs forever in a thread.
Requests arrive at any time through an inbox and join at the next step; after
each step, every sequence that ran publishes its new token ids and its newly
stable text to its `RequestStream`. A caller that stops reading aborts its
request, and its blocks return to the pool at the next step.
"""
from __future__ import annotations

import asyncio
import importlib
import itertools
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

from common.sequence import RequestMetrics, Sequence
from common.validate import check_int

from .metrics import EngineMetrics

kernels = importlib.import_module("stages.04_kernels")
paged = importlib.import_module("stages.03_paged_kv")
_request_ids = itertools.count()


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
    """What one request's caller reads: chunks in order, the last with a finish_reason."""
    request_id: str
    seq: Sequence
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
            chunk = self.chunks.get()
            yield chunk
            if chunk.finish_reason is not None:
                return

    async def __aiter__(self):
        while True:
            chunk = await self.async_chunks.get()
            yield chunk
            if chunk.finish_reason is not None:
                return


class LLM(kernels.LLM):
    def __init__(self, model: str = "smollm2-135m", *, max_waiting: int = 256, **kwargs):
        check_int("max_waiting", max_waiting, 1)
        super().__init__(model, **kwargs)
        self.max_waiting = max_waiting
        self.scheduler = paged.Scheduler(self.block_manager, self.max_num_seqs, self.max_num_batched_tokens,
                                         self.enable_prefix_caching)
        self.metrics = EngineMetrics()
        # A server runs for days: keep only the recent per-step history.
        self.block_timeline, self.timeline = deque(maxlen=10_000), deque(maxlen=10_000)
        self._inbox: queue.Queue = queue.Queue()  # new streams and aborts, applied between steps
        self._streams: dict[str, RequestStream] = {}  # by request id
        self._by_seq: dict[int, RequestStream] = {}  # by seq_id
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()  # two first requests must not start two engine loops
        self.loops_started = 0
        self._stopping = False

    # ---- the caller's side (any thread) ---------------------------------------------------
    def add_request(self, prompt, params=None, loop: asyncio.AbstractEventLoop | None = None) -> RequestStream:
        """Validate and enqueue a request; raise ValueError (bad input) or QueueFull (back off)."""
        seq = self.make_sequence(prompt, params)
        if self.num_waiting >= self.max_waiting:
            raise QueueFull(f"{self.max_waiting} requests are already waiting; retry shortly")
        stream = RequestStream(f"req-{next(_request_ids)}", seq, loop=loop,
                               async_chunks=asyncio.Queue() if loop is not None else None)
        self._start()
        self._inbox.put(("add", stream))
        self._wakeup.set()
        return stream

    def stream(self, prompt, params=None):
        """Yield a `StreamChunk` per step that produced new text; stop reading to abort the request."""
        stream = self.add_request(prompt, params)
        try:
            yield from stream
        finally:
            if not stream.done.is_set():  # the caller stopped early: abort at the next step
                self.abort(stream.request_id)

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet running: in the inbox or the scheduler's queue."""
        return self._inbox.qsize() + len(self.scheduler.waiting)

    def is_alive(self) -> bool:
        """False once the engine loop has died (it starts with the first request)."""
        return self._thread is None or self._thread.is_alive()

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wakeup.set()

    def shutdown(self) -> None:
        with self._start_lock:
            self._stopping = True
            self._wakeup.set()
            if self._thread is not None:
                self._thread.join(timeout=30)
                self._thread = None

    def _run(self, seqs: list[Sequence]) -> None:
        """`generate` on the background engine: submit every request, wait for all."""
        streams = [RequestStream(f"req-{next(_request_ids)}", seq) for seq in seqs]
        self._start()
        for stream in streams:
            self._inbox.put(("add", stream))
        self._wakeup.set()
        for stream in streams:
            for _ in stream:  # drain: generate() returns whole outputs
                pass

    # ---- the engine's side (its own thread) ---------------------------------------------------
    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, name="stepwise-engine", daemon=True)
                self._thread.start()
                self.loops_started += 1

    def _loop(self) -> None:
        while not self._stopping:
            self._apply_inbox()
            if not self.scheduler.has_work():
                self._wakeup.wait(0.05)
                self._wakeup.clear()
                continue
            try:
                batch = self.step()
            except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
                traceback.print_exc()
                self._fail_all(f"engine error: {type(e).__name__}: {e}")
                continue
            for seq in batch:
                self._publish(seq)

    def _apply_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                item.seq.metrics.arrival_time = min(item.seq.metrics.arrival_time, time.perf_counter())
                self._streams[item.request_id] = item
                self._by_seq[item.seq.seq_id] = item
                self.scheduler.add(item.seq)
            elif (stream := self._streams.get(item)) is not None:
                self.scheduler.abort(stream.seq)
                self._publish(stream.seq)

    def _publish(self, seq: Sequence) -> None:
        stream = self._by_seq.get(seq.seq_id)
        if stream is None:
            return
        stable = seq.stable_text_len
        text, ids = seq.output_text[stream.sent_text:stable], seq.output_token_ids[stream.sent_tokens:]
        stream.sent_text, stream.sent_tokens = max(stream.sent_text, stable), len(seq.output_token_ids)
        if seq.is_finished:
            self._forget(stream)
            self.metrics.observe(seq)
            stream.put(StreamChunk(text, ids, seq.finish_reason, seq.metrics))
        elif text or ids:
            stream.put(StreamChunk(text, ids))

    def _fail_all(self, message: str) -> None:
        for stream in list(self._streams.values()):
            self.scheduler.abort(stream.seq)
            stream.seq.finish_reason = "error"
            self._forget(stream)
            stream.put(StreamChunk("", [], "error", stream.seq.metrics, error=message))

    def _forget(self, stream: RequestStream) -> None:
        del self._streams[stream.request_id]
        del self._by_seq[stream.seq.seq_id]

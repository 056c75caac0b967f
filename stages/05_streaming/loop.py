"""Stage 05's one loop: the inbox of new requests and aborts, the engine step, and publishing what it produced.

Requests join through the inbox at any time, between steps; after each step, every sequence that ran
publishes its new token ids and its newly stable text to its `RequestStream`. A caller that stops reading
aborts its request, and its blocks return to the pool at the next step.

Who runs the loop matters more than it seems: torch ops issued from a second Python thread ran markedly
slower here than on the main thread (libgomp, torch's OpenMP runtime, makes a second thread's parallel regions
wake sleeping workers every time; docs/streaming.md has the measurement). So the loop runs on whoever needs
tokens: a synchronous reader steps the engine on its own thread (one stepper at a time, under a lock), and the
server gives it the main thread (`run_forever`) while HTTP runs in a background thread. Only asynchronous
readers with nobody else stepping get a background thread (`start_background_loop`).
"""
from __future__ import annotations

import queue
import threading
import time
import traceback

from .streams import Outbox, RequestStream, StreamChunk, stable_text_len


class EngineLoop:
    def __init__(self, engine, step, metrics, gauges):
        """``engine``: what it steps and feeds; ``step``: the front end's step, which every observer sees;
        ``metrics`` and ``gauges``: told of the requests it ends without a step (aborted, failed)."""
        self.engine, self.step, self.metrics, self.gauges = engine, step, metrics, gauges
        self.inbox: queue.Queue = queue.Queue()  # ("add", stream) and ("abort", request id), applied between steps
        self.streams: dict[str, RequestStream] = {}  # by request id
        self.by_seq: dict[int, RequestStream] = {}  # by seq_id
        self.wakeup = threading.Event()
        self.outbox = Outbox(lambda stream: self.abort(stream.request_id))  # async readers' chunks, once a step
        self.stepping = threading.Lock()  # held by whoever steps the engine (a loop holds it while it runs)
        self.start_lock = threading.Lock()  # two async first requests must not start two background loops
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.looping = False  # run_forever is stepping the engine
        self.loops_started = 0

    # ---- the callers' side (any thread) ---------------------------------------------------
    def submit(self, streams: list[RequestStream]) -> None:
        for stream in streams:
            self.inbox.put(("add", stream))
        self.wakeup.set()

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id))
        self.wakeup.set()

    def read(self, stream: RequestStream):
        """A synchronous reader's chunks, to the last; while none is ready, step the engine on this thread if
        nobody else does."""
        while True:
            chunk = self.next_chunk(stream)
            yield chunk
            if chunk.finish_reason is not None:
                return

    def next_chunk(self, stream: RequestStream) -> StreamChunk:
        while True:
            try:
                return stream.chunks.get_nowait()
            except queue.Empty:
                pass
            if self.stepping.acquire(blocking=False):
                try:
                    self.run_step()
                finally:
                    self.stepping.release()
            else:  # another reader or a loop is stepping: wait for what it publishes
                try:
                    return stream.chunks.get(timeout=0.05)
                except queue.Empty:
                    pass

    # ---- the stepping side ------------------------------------------------------------------
    def run_step(self) -> bool:
        """Apply the inbox, run one engine step, publish what it produced; False when there was nothing to run."""
        with self.outbox.holding():
            try:
                self.apply_inbox()
                if not self.engine.has_work():
                    return False
                event = self.step()
            except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
                traceback.print_exc()
                self.fail_all(f"engine error: {type(e).__name__}: {e}")
                return True
            for s in event.seqs:
                self.publish(s.seq)
            return True

    def apply_inbox(self) -> None:
        aborted = False
        while True:
            try:
                kind, item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                item.seq.metrics.arrival_time = min(item.seq.metrics.arrival_time, time.perf_counter())
                self.streams[item.request_id] = item
                self.by_seq[item.seq.seq_id] = item
                self.engine.add(item.seq)
            elif (stream := self.streams.get(item)) is not None:
                self.engine.abort(stream.seq)
                self.metrics.observe(stream.seq)
                self.publish(stream.seq)
                aborted = True
        if aborted:  # no step may follow to refresh the gauges
            self.gauges.update(self.engine.state())

    def publish(self, seq) -> None:
        stream = self.by_seq.get(seq.seq_id)
        if stream is None:
            return
        stable = stable_text_len(seq)
        text, ids = seq.output_text[stream.sent_text:stable], seq.output_token_ids[stream.sent_tokens:]
        stream.sent_text, stream.sent_tokens = max(stream.sent_text, stable), len(seq.output_token_ids)
        if seq.is_finished:
            self.forget(stream)
            stream.put(StreamChunk(text, ids, seq.finish_reason, seq.metrics, error=seq.error,
                                    rejected=seq.error is not None))
        elif text or ids:
            stream.put(StreamChunk(text, ids))

    def fail_all(self, message: str, reason: str = "error") -> None:
        for stream in list(self.streams.values()):
            self.engine.abort(stream.seq)
            stream.seq.finish_reason = reason
            self.metrics.observe(stream.seq)
            self.forget(stream)
            stream.put(StreamChunk("", [], reason, stream.seq.metrics, error=message))
        self.gauges.update(self.engine.state())

    def forget(self, stream: RequestStream) -> None:
        del self.streams[stream.request_id]
        del self.by_seq[stream.seq.seq_id]

    # ---- who steps ------------------------------------------------------------------------------
    def is_alive(self) -> bool:
        """False once a background loop has died."""
        return self.thread is None or self.thread.is_alive()

    def run_forever(self, stop: threading.Event, on_start=None) -> None:
        """Step the engine on this thread until ``stop`` is set (a server's main thread); ``on_start`` is called
        once the loop owns the engine (start the HTTP server there, so no request can start another loop)."""
        with self.stepping:
            self.looping = True
            try:
                if on_start is not None:
                    on_start()
                while not stop.is_set():
                    if not self.run_step():
                        self.wakeup.wait(0.05)
                        self.wakeup.clear()
            finally:
                self.looping = False

    def start_background_loop(self) -> None:
        with self.start_lock:
            if not self.looping and (self.thread is None or not self.thread.is_alive()):
                self.stop.clear()
                self.thread = threading.Thread(target=self.run_forever, args=(self.stop,), name="stepwise-engine",
                                               daemon=True)
                self.thread.start()
                self.loops_started += 1

    def shutdown(self) -> None:
        """Stop a background loop, then end every request still in flight (its reader gets a final "abort" chunk
        saying why, instead of waiting for tokens nobody will compute)."""
        with self.start_lock:
            self.stop.set()
            self.wakeup.set()
            if self.thread is not None:
                self.thread.join(timeout=30)
                self.thread = None
        with self.stepping:
            self.apply_inbox()
            self.fail_all("the engine shut down before this request finished", reason="abort")

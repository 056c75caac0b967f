"""Stage 05: tokens reach the caller as soon as they exist.

Stage 04's engine steps (schedule -> run -> postprocess) in a loop that never ends while
requests keep arriving. Requests join through an inbox at any time, between steps; after
each step, every sequence that ran publishes its new token ids and its newly stable text to
its `RequestStream`. A caller that stops reading aborts its request, and its blocks return
to the pool at the next step.

Who runs the loop is ``loop.py``'s concern: the caller's thread for `generate` and `stream`, the main
thread for the server, a background thread only for asynchronous readers with nobody else stepping.
"""
from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
import traceback

from common.engine import StepResult
from common.llm import LLM as FrontEnd
from common.sequence import Sequence
from common.sampling import SamplingParams
from common.validate import InvalidParam, check_int
from stages import kernels, paged_kv as paged

from .loop import EngineLoop
from .metrics import EngineMetrics
from .streams import Outbox, QueueFull, RequestStream, StreamChunk, stable_text_len

_request_ids = itertools.count()
__all__ = ["LLM", "QueueFull", "RequestStream", "StreamChunk"]


class Scheduler(paged.Scheduler):
    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is (a client gave up); its blocks go back to the pool."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self.block_manager.free_sequence(seq)
        if not seq.is_finished:
            seq.finish("abort")


class LLMEngine(kernels.LLMEngine):
    scheduler_class = Scheduler


class LLM(EngineLoop, FrontEnd):
    engine_class = LLMEngine

    def __init__(self, model: str = "smollm2-135m", *, max_waiting: int = 256, **kwargs):
        check_int("max_waiting", max_waiting, 1)
        super().__init__(model, **kwargs)
        self.max_waiting = max_waiting
        self.metrics = EngineMetrics()  # a server's latency histograms, kept across runs
        self._inbox: queue.Queue = queue.Queue()  # new streams and aborts, applied between steps
        self._streams: dict[str, RequestStream] = {}  # by request id
        self._by_seq: dict[int, RequestStream] = {}  # by seq_id
        self._wakeup = threading.Event()
        self._outbox = Outbox(lambda stream: self.abort(stream.request_id))  # async readers' chunks, once a step
        self._stepping = threading.Lock()  # held by whoever steps the engine (a loop holds it while it runs)
        self._start_lock = threading.Lock()  # two async first requests must not start two background loops
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.looping = False  # a loop (run_forever) is stepping the engine
        self.loops_started = 0
        self._gauges = self._read_gauges()

    @property
    def execution_path(self) -> str:
        return self.model.path

    # ---- the caller's side (any thread) ---------------------------------------------------
    def add_request(self, prompt, params=None, loop: asyncio.AbstractEventLoop | None = None) -> RequestStream:
        """Validate and enqueue a request; raise ValueError (bad input) or QueueFull (back off)."""
        params = SamplingParams.coerce(params)
        if params.n != 1:
            raise InvalidParam("n", f"a stream carries one sample (n={params.n}): call add_samples for n streams")
        return self.add_samples(prompt, params, loop)[0]

    def add_samples(self, prompt, params=None, loop: asyncio.AbstractEventLoop | None = None) -> list[RequestStream]:
        """A request's n samples (SamplingParams.n), one stream each: they share the prompt's KV blocks."""
        group = self.make_samples(prompt, params)
        if self.num_waiting + len(group) > self.max_waiting:
            raise QueueFull(f"{self.max_waiting} requests are already waiting; retry shortly")
        streams = [RequestStream(f"req-{next(_request_ids)}", seq, self.next_chunk, loop=loop,
                                 async_chunks=asyncio.Queue() if loop is not None else None, outbox=self._outbox)
                   for seq in group]
        for stream in streams:
            self._inbox.put(("add", stream))
        self._wakeup.set()
        if loop is not None and not self.looping:  # an async reader cannot step the engine itself
            self.start_background_loop()
        return streams

    def stream(self, prompt, params=None):
        """Yield a `StreamChunk` per step that produced new text; stop reading to abort the request."""
        stream = self.add_request(prompt, params)
        try:
            yield from stream
        finally:
            if not stream.done.is_set():  # the caller stopped early: abort at the next step
                self.abort(stream.request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wakeup.set()

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet running: in the inbox or the scheduler's queue."""
        return self._inbox.qsize() + self._gauges["waiting"]

    def gauges(self) -> dict[str, float]:
        """The engine's state after its last step (requests, KV blocks, prefix hits, preemptions): a snapshot the
        stepping thread replaces whole, so a reader on another thread never sees it half-written."""
        return self._gauges

    def _run(self, seqs: list[Sequence]) -> None:
        """`generate`: submit every request, then read each to its end (stepping the engine here)."""
        streams = [RequestStream(f"req-{next(_request_ids)}", seq, self.next_chunk) for seq in seqs]
        for stream in streams:
            self._inbox.put(("add", stream))
        for stream in streams:
            for _ in stream:  # drain: generate() returns whole outputs
                pass

    def run_step(self) -> bool:
        """Apply the inbox, run one engine step, publish what it produced; False when there was nothing to run."""
        with self._outbox.holding():
            return self._step_and_publish()

    def _step_and_publish(self) -> bool:
        try:
            self._apply_inbox()
            if not self.engine.has_work():
                return False
            step = self.engine.step()
        except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
            traceback.print_exc()
            self._fail_all(f"engine error: {type(e).__name__}: {e}")
            return True
        self.observe(step)
        for seq in step.seqs:
            self._publish(seq)
        self._gauges = self._read_gauges()
        return True

    def observe(self, step: StepResult) -> None:
        super().observe(step)
        self.metrics.preemptions += step.preempted
        for seq in step.seqs:
            if seq.is_finished:
                self.metrics.observe(seq)

    def _read_gauges(self) -> dict[str, float]:
        e = self.engine
        pc, bm = e.prefix_cache, e.block_manager
        return {"waiting": len(e.scheduler.waiting), "running": len(e.scheduler.running),
                "kv_blocks_used": bm.num_used_blocks, "kv_blocks_free": bm.num_free_blocks,
                "kv_blocks": bm.num_blocks, "prefix_hit_rate": pc.hit_tokens / pc.queried_tokens
                if pc is not None and pc.queried_tokens else 0.0, "preemptions": self.metrics.preemptions}

    def _apply_inbox(self) -> None:
        applied = False
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                if applied:  # an abort with nothing left to run: no step follows to refresh the gauges
                    self._gauges = self._read_gauges()
                return
            applied = True
            if kind == "add":
                item.seq.metrics.arrival_time = min(item.seq.metrics.arrival_time, time.perf_counter())
                self._streams[item.request_id] = item
                self._by_seq[item.seq.seq_id] = item
                self.engine.add(item.seq)
            elif (stream := self._streams.get(item)) is not None:
                self.engine.scheduler.abort(stream.seq)
                self.metrics.observe(stream.seq)
                self._publish(stream.seq)

    def _publish(self, seq: Sequence) -> None:
        stream = self._by_seq.get(seq.seq_id)
        if stream is None:
            return
        stable = stable_text_len(seq)
        text, ids = seq.output_text[stream.sent_text:stable], seq.output_token_ids[stream.sent_tokens:]
        stream.sent_text, stream.sent_tokens = max(stream.sent_text, stable), len(seq.output_token_ids)
        if seq.is_finished:
            self._forget(stream)
            stream.put(StreamChunk(text, ids, seq.finish_reason, seq.metrics))
        elif text or ids:
            stream.put(StreamChunk(text, ids))

    def _fail_all(self, message: str, reason: str = "error") -> None:
        for stream in list(self._streams.values()):
            self.engine.scheduler.abort(stream.seq)
            stream.seq.finish_reason = reason
            self.metrics.observe(stream.seq)
            self._forget(stream)
            stream.put(StreamChunk("", [], reason, stream.seq.metrics, error=message))
        self._gauges = self._read_gauges()

    def _forget(self, stream: RequestStream) -> None:
        del self._streams[stream.request_id]
        del self._by_seq[stream.seq.seq_id]

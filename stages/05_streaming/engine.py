"""Stage 05: tokens reach the caller as soon as they exist.

Stage 04's engine, unchanged (``build``), steps (schedule -> run -> postprocess) in a loop that never ends while
requests keep arriving (`EngineLoop`, loop.py): requests join through its inbox between steps, and after each step
every sequence that ran publishes its new tokens and newly stable text to its `RequestStream` (streams.py). The `LLM`
here is the front end every stage shares, with that loop beside it and a server's metrics and gauges as observers.
The loop knows the engine, not this front end: it is handed the engine, the front end's step and two observers.
"""
from __future__ import annotations

import asyncio
import itertools
from collections import deque

from common.engine import LLMEngine
from common.engine_config import EngineConfig
from common.llm import LLM as FrontEnd
from common.paths import DEFAULT_MODEL
from common.sampling import SamplingParams
from common.sequence import Sequence
from common.stats import EngineStats
from common.validate import InvalidParam
from stages.kernels import build as kernels_build  # stage 04: engine.py

from .loop import EngineLoop
from .metrics import EngineMetrics, Gauges
from .streams import QueueFull, RequestStream, StreamChunk

_request_ids = itertools.count()
SERVER_HISTORY = 1_000  # steps of timeline a server keeps (a generate call keeps common/stats.py's HISTORY)
__all__ = ["LLM", "QueueFull", "RequestStream", "StreamChunk"]


def build(config: EngineConfig, tokenizer=None) -> LLMEngine:
    """Stage 04's engine as it is (stages/04_kernels/engine.py): this stage changes who steps it and who reads it."""
    return kernels_build(config, tokenizer)


class LLM(FrontEnd):
    build = staticmethod(build)

    def __init__(self, model: str = DEFAULT_MODEL, **options):
        """``max_waiting`` (an `EngineConfig` option): requests queued past which `add_request` raises QueueFull."""
        super().__init__(model, **options)
        self.max_waiting = self.engine_config.scheduler.max_waiting
        self.metrics = self.add_observer(EngineMetrics())  # a server's latency histograms, kept across runs
        self.engine_gauges = self.add_observer(Gauges(self.metrics))
        self.engine_gauges.update(self.engine.state())
        self.loop = EngineLoop(self.engine, self.step, self.metrics, self.engine_gauges)

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
        """A request's n samples, one stream each, sharing the prompt's KV blocks; read with ``async for`` on ``loop``,
        else with `read` on this thread."""
        group = self.make_samples(prompt, params)
        if self.num_waiting + len(group) > self.max_waiting:
            raise QueueFull(f"{self.max_waiting} requests are already waiting; retry shortly")
        streams = [RequestStream(f"req-{next(_request_ids)}", seq, loop=loop, outbox=self.loop.outbox,
                                 async_chunks=asyncio.Queue() if loop is not None else None) for seq in group]
        self.loop.submit(streams)
        if loop is not None and not self.loop.looping:  # an async reader cannot step the engine itself
            self.loop.start_background_loop()
        return streams

    def read(self, stream: RequestStream):
        """A stream's chunks, to its last, stepping the engine on this thread while nobody else does."""
        return self.loop.read(stream)

    def stream(self, prompt, params=None):
        """Yield a `StreamChunk` per step that produced new text; stop reading to abort the request."""
        stream = self.add_request(prompt, params)
        try:
            yield from self.loop.read(stream)
        finally:
            if not stream.done.is_set():  # the caller stopped early: abort at the next step
                self.abort(stream.request_id)

    def abort(self, request_id: str) -> None:
        self.loop.abort(request_id)

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet running: in the inbox or the scheduler's queue."""
        return self.loop.inbox.qsize() + self.engine_gauges.snapshot["waiting"]

    def gauges(self) -> dict[str, float]:
        """The engine's state after its last step: a snapshot replaced whole, so no thread reads it half-written."""
        return self.engine_gauges.snapshot

    def server_gauges(self) -> dict[str, tuple[float, str]]:
        """Gauges a later stage adds to the server's /metrics: name -> (value, help). None here."""
        return {}

    def _run(self, seqs: list[Sequence]) -> None:
        """`generate`: submit every request, then read each to its end (stepping the engine here)."""
        streams = [RequestStream(f"req-{next(_request_ids)}", seq) for seq in seqs]
        self.loop.submit(streams)
        for stream in streams:
            for _ in self.loop.read(stream):  # drain: generate() returns whole outputs
                pass

    # ---- the loop, as a server drives it ----------------------------------------------------
    def run_forever(self, stop, on_start=None) -> None:
        """Step the engine on this thread until ``stop`` is set, keeping SERVER_HISTORY steps of timeline (nothing may
        grow per step for a server's life)."""
        self.stats = EngineStats(timeline=deque(maxlen=SERVER_HISTORY), block_timeline=deque(maxlen=SERVER_HISTORY))
        self.loop.run_forever(stop, on_start)

    def is_alive(self) -> bool:
        return self.loop.is_alive()

    def shutdown(self) -> None:
        self.loop.shutdown()

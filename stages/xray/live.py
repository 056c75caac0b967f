"""The live X-ray: stage 05's server serves the page at /xray and the engine's steps at /xray/events
(server-sent events), so a class can watch a load run fill the blocks and preempt.

The observer (`LiveXray.on_step`) runs in the engine's stepping thread and must never slow it: with no page
open it returns at once; with one, it encodes the step (common/trace.py's `StepEncoder`) into a bounded buffer and
wakes the event loop, at most once per batch of steps. The loop hands each step to every client's bounded
queue. A client that falls behind (its queue full, or steps lost from the buffer) drops what it had, gets a
"resync" event, and waits for a keyframe, which the engine thread writes at its next step: the page then holds
the whole state again. The engine never waits for a client.

The events are behind the server's --api-key when one is set (the page sends 'Authorization: Bearer KEY', from
a box it shows or from its address's #key=...). The page itself holds no data and is served without one: a
browser's address bar cannot send the header.
"""
from __future__ import annotations

import asyncio
import json
from collections import deque

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from . import page
from common.trace import StepEncoder

QUEUE = 256  # steps a client may fall behind before it resyncs
BUFFER = 4096  # steps the engine thread may run ahead of the event loop
KEEPALIVE_S = 1.0  # how often an idle stream checks the server is not shutting down (and sends a comment)


class Client:
    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue(QUEUE)
        self.needs_key = True  # until a keyframe arrives, deltas mean nothing to it


class LiveXray:
    """The observer and the clients it feeds."""

    def __init__(self, label: str = "live"):
        self.label = label
        self.encoder = StepEncoder()
        self.clients: set[Client] = set()  # touched on the event loop only
        self.active = False  # read by the engine thread: any client connected
        self.want_key = False  # set by the loop, read by the engine thread: the next step is a keyframe
        self.pending: deque = deque(maxlen=BUFFER)  # (number, step) from the engine thread
        self.produced = 0  # steps encoded (engine thread)
        self.expected = 0  # the next number the loop expects: a gap means the buffer overflowed
        self.scheduled = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sent = 0  # steps handed to clients (for the tests)

    # ---- the engine thread ------------------------------------------------------------------------------------
    def on_step(self, event) -> None:
        if not self.active:
            self.encoder.need_key = True
            return
        if self.want_key:
            self.want_key = False
            self.encoder.need_key = True
        self.pending.append((self.produced, self.encoder.encode(event)))
        self.produced += 1
        if not self.scheduled:
            self.scheduled = True
            try:
                self.loop.call_soon_threadsafe(self.deliver)
            except RuntimeError:  # the loop closed: the server is stopping
                pass

    # ---- the event loop ---------------------------------------------------------------------------------------
    def deliver(self) -> None:
        self.scheduled = False  # before draining: a step appended from now on schedules another delivery
        while self.pending:
            number, step = self.pending.popleft()
            gap, self.expected = number != self.expected, number + 1
            text = f"event: step\ndata: {json.dumps(step, separators=(',', ':'))}\n\n"
            for client in list(self.clients):
                self.offer(client, text, bool(step.get("key")), gap)

    def offer(self, client: Client, text: str, key: bool, gap: bool) -> None:
        if client.needs_key and not key:
            self.want_key = True
            return
        if (gap and not key) or client.queue.full():
            while not client.queue.empty():
                client.queue.get_nowait()
            client.queue.put_nowait("event: resync\ndata: {}\n\n")
            client.needs_key, self.want_key = True, True
            return
        client.needs_key = False
        client.queue.put_nowait(text)
        self.sent += 1

    def connect(self) -> Client:
        self.loop = asyncio.get_running_loop()
        client = Client()
        self.clients.add(client)
        self.want_key, self.active = True, True
        return client

    def disconnect(self, client: Client) -> None:
        self.clients.discard(client)
        self.active = bool(self.clients)

    async def stream(self, hello: dict, closing):
        """One client's events, until it goes away or the server begins to shut down."""
        client = self.connect()
        try:
            yield f"retry: 2000\nevent: hello\ndata: {json.dumps(hello)}\n\n"
            while not closing():
                try:
                    yield await asyncio.wait_for(client.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield ": waiting for the engine's next step\n\n"
        finally:
            self.disconnect(client)


def add_xray_routes(app, llm, check_api_key=None, label: str = "stage 05 server") -> LiveXray:
    """Serve the live X-ray of ``llm`` (a stage-05 `LLM` in this process) at /xray and /xray/events.
    ``check_api_key``: the server's check of a request's API key (a FastAPI dependency), which the events pass
    first; None when the server takes no key."""
    live = llm.add_observer(LiveXray(label))
    router = APIRouter()
    html = page.render(live={"events": "/xray/events", "label": label, "api_key": check_api_key is not None})
    guard = [Depends(check_api_key)] if check_api_key is not None else []

    @router.get("/xray", response_class=HTMLResponse, include_in_schema=False)
    async def xray_page():
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @router.get("/xray/events", dependencies=guard, include_in_schema=False)
    async def xray_events(request: Request):
        drain = getattr(request.app.state, "drain", None)
        hello = {"label": label, "gauges": llm.gauges()}
        return StreamingResponse(live.stream(hello, lambda: drain is not None and drain.closing),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    app.include_router(router)
    return live

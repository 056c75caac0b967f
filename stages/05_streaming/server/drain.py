"""Drain: the requests in flight, so a graceful shutdown can bound its wait (see ``shutdown.py``)."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager


class Drain:
    """The requests in flight, and their shutdown."""

    def __init__(self, engine):  # anything with abort(request_id): backend.LocalEngine, gateway.RemoteEngine
        self.engine = engine
        self.active: set[str] = set()  # request ids
        self.closing = False
        self.loop: asyncio.AbstractEventLoop | None = None

    def begin(self, grace_seconds: float) -> None:
        """Refuse new requests; abort the running ones in ``grace_seconds``. Safe from a signal handler or thread."""
        self.closing = True
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.call_later, grace_seconds, self.abort_all)

    def abort_all(self) -> None:
        for request_id in list(self.active):
            self.engine.abort(request_id)

    @asynccontextmanager
    async def lifespan(self, app):
        self.loop = asyncio.get_running_loop()
        yield
        self.abort_all()  # whatever uvicorn had to cancel must not keep its KV blocks

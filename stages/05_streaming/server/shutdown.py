"""Serving and its graceful shutdown: on SIGTERM or SIGINT, stop accepting, let the requests in flight finish
until a deadline, abort the rest (every open stream still gets a final event), and exit. A second signal exits
at once. The engine loop owns the main thread (torch's parallel regions run slower from a second thread:
docs/streaming.md); HTTP runs in a background thread.

uvicorn already stops accepting and waits for open connections on the first signal, but it
waits as long as the connections last: a request for 2,000 tokens holds it for minutes.
`Drain` bounds that wait: at the deadline it aborts every request still in flight, the engine
ends them at its next step, and their handlers answer (a 503, or an error event and
``[DONE]`` on a stream), so the connections close and uvicorn finishes.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING

import uvicorn

from common.paths import DEFAULT_MODEL

from ..engine import LLM
from .app import create_app
from .memory import Trimmer, settle_malloc

if TYPE_CHECKING:
    from ..cluster.gateway import RemoteEngine


def serve(llm: LLM | RemoteEngine, host: str = "127.0.0.1", port: int = 8000, model_name: str = DEFAULT_MODEL,
          shutdown_timeout: float = 5.0, **app_options) -> None:
    """The engine loop on this (the main) thread, HTTP in a background thread; SIGTERM/SIGINT drain the
    server within ``shutdown_timeout`` seconds, a second signal exits at once."""
    settle_malloc()  # before the server's threads start (memory.py: RSS that follows what the server uses)
    app = create_app(llm, model_name, **app_options)
    # uvicorn's own timeout is the backstop: it cancels handlers still running 2 s after the deadline.
    config = uvicorn.Config(app, host=host, port=port, log_level="info",
                            timeout_graceful_shutdown=shutdown_timeout + 2)
    http = uvicorn.Server(config)  # off the main thread, uvicorn installs no signal handlers: these do
    stopped = threading.Event()

    def on_signal(sig: int, frame) -> None:
        if http.should_exit:  # the operator asked twice: no more waiting
            os._exit(128 + sig)
        http.should_exit = True  # uvicorn stops accepting and waits for the open connections
        app.state.drain.begin(shutdown_timeout)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    def run_http() -> None:
        try:
            http.run()
        finally:
            stopped.set()

    Trimmer().start(stopped)
    # torch runs on the main thread, at full speed (a local LLM; the cluster's engine only waits here); a drained
    # server exits with 0.
    llm.run_forever(stopped, on_start=threading.Thread(target=run_http, name="http", daemon=True).start)

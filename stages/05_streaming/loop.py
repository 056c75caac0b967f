"""Who steps the engine: the one loop of stage 05, and the threads that may run it.

Who runs the loop matters more than it seems: torch ops issued from a second Python thread ran
markedly slower here than on the main thread (libgomp, torch's OpenMP runtime, makes a second
thread's parallel regions wake sleeping workers every time; docs/streaming.md has the measurement).
So the loop runs on whoever needs tokens: `generate` and `stream` step the engine on the caller's
thread (one stepper at a time, under a lock), and the server gives it the main thread
(`run_forever`) while HTTP runs in a background thread. Only asynchronous readers with nobody
else stepping get a background thread (`start_background_loop`).
"""
from __future__ import annotations

import queue
import threading

from .streams import RequestStream, StreamChunk


class EngineLoop:
    """The stepping half of stage 05's `LLM` (engine.py holds the requests' half: inbox, step, publish)."""
    _stepping: threading.Lock
    _start_lock: threading.Lock
    _thread: threading.Thread | None
    _stop: threading.Event
    _wakeup: threading.Event
    looping: bool
    loops_started: int

    def next_chunk(self, stream: RequestStream) -> StreamChunk:
        """The stream's next chunk; while there is none, step the engine on this thread if nobody else does."""
        while True:
            try:
                return stream.chunks.get_nowait()
            except queue.Empty:
                pass
            if self._stepping.acquire(blocking=False):
                try:
                    self.run_step()
                finally:
                    self._stepping.release()
            else:  # another reader or a loop is stepping: wait for what it publishes
                try:
                    return stream.chunks.get(timeout=0.05)
                except queue.Empty:
                    pass

    def is_alive(self) -> bool:
        """False once a background loop has died."""
        return self._thread is None or self._thread.is_alive()

    def run_forever(self, stop: threading.Event, on_start=None) -> None:
        """Step the engine on this thread until ``stop`` is set (a server's main thread); ``on_start`` is called
        once the loop owns the engine (start the HTTP server there, so no request can start another loop)."""
        with self._stepping:
            self.looping = True
            try:
                if on_start is not None:
                    on_start()
                while not stop.is_set():
                    if not self.run_step():
                        self._wakeup.wait(0.05)
                        self._wakeup.clear()
            finally:
                self.looping = False

    def start_background_loop(self) -> None:
        with self._start_lock:
            if not self.looping and (self._thread is None or not self._thread.is_alive()):
                self._stop.clear()
                self._thread = threading.Thread(target=self.run_forever, args=(self._stop,), name="stepwise-engine",
                                                daemon=True)
                self._thread.start()
                self.loops_started += 1

    def shutdown(self) -> None:
        """Stop a background loop, then end every request still in flight (its reader gets a final "abort" chunk
        saying why, instead of waiting for tokens nobody will compute)."""
        with self._start_lock:
            self._stop.set()
            self._wakeup.set()
            if self._thread is not None:
                self._thread.join(timeout=30)
                self._thread = None
        with self._stepping:
            self._apply_inbox()
            self._fail_all("the engine shut down before this request finished", reason="abort")

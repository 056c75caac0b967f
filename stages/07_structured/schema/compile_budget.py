"""A compile that takes too long fails its request alone, after a budget of wall-clock seconds.

Most schemas compile in milliseconds; a few real ones take seconds (JSONSchemaBench's largest: tens of seconds in
xgrammar), and neither backend can be told to stop part way. So a compile runs on a thread of its own and the
thread that prepares the request waits for it at most ``budget_s`` seconds (``grammar_compile_budget_s``, 2 s by
default). Past it the request fails with "too complex to compile in 2 s", a 400 through the server; the engine and
the other requests never wait for it (the compile runs off the engine's thread, and both backends compile without
holding the interpreter lock). The abandoned compile runs to its end and its grammar enters the cache, so the same
constraint sent again is served at once; while it is still compiling, a second request for it waits on the same
compile (within its own budget) instead of starting another. At most ``max_overtime`` compiles run on past their
budget at once (two, the cores of a small machine): while that many do, a constraint not compiling yet is turned away
as the server turns away a request when its queue is full (`QueueFull`, a 503 to retry later), so that a client
sending distinct heavy schemas cannot fill the machine with compiles nobody waits for.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Callable

from common.validate import InvalidParam
from stages.streaming import QueueFull  # stage 05: streams.py (a 503: retry later)


class CompileBudget:
    """The compiles in flight (constraint key -> its future), each on a daemon thread: a compile left running when
    the process exits is simply dropped."""

    def __init__(self, max_overtime: int = 2):
        self.pending: dict[object, Future] = {}
        self.lock = threading.Lock()
        self.overtime = 0  # compiles that ran past a request's budget (each failed that request)
        self.running_over: set = set()  # the keys of those still running
        self.max_overtime = max_overtime

    def run(self, key, build: Callable[[], object], budget_s: float, what: str):
        """``build()``'s result if it finishes within ``budget_s`` seconds (its exception if it raises); else
        `InvalidParam` saying the constraint is too complex to compile in that time."""
        with self.lock:
            future = self.pending.get(key)
            if future is None:
                if len(self.running_over) >= self.max_overtime:
                    raise QueueFull(f"structured_outputs.{what}: {len(self.running_over)} earlier constraints are "
                                    f"still compiling past their budget; send this one again in a few seconds")
                future = self.pending[key] = Future()
                threading.Thread(target=self.work, args=(key, build, future), daemon=True,
                                 name="grammar-compile").start()
        try:
            return future.result(timeout=budget_s)
        except FutureTimeout:
            with self.lock:
                self.overtime += 1
                if key in self.pending:  # not finished in the meantime
                    self.running_over.add(key)
            raise InvalidParam("structured_outputs", too_slow(what, budget_s)) from None

    def work(self, key, build: Callable[[], object], future: Future) -> None:
        try:
            future.set_result(build())
        except BaseException as e:  # noqa: BLE001 - handed to the waiting request, which raises it
            future.set_exception(e)
        finally:
            with self.lock:
                self.pending.pop(key, None)
                self.running_over.discard(key)


def too_slow(what: str, budget_s: float) -> str:
    """The refusal's words; coverage counts its first part (``too_slow_reason``) as the reason."""
    return (f"structured_outputs.{what}: {too_slow_reason(budget_s)} (grammar_compile_budget_s): the compile goes "
            f"on in the background and the same constraint sent again is served from the grammar cache once it is "
            f"done; or simplify the schema (fewer alternatives, shorter enums)")


def too_slow_reason(budget_s: float) -> str:
    return f"schema too complex to compile in {budget_s:g} s"

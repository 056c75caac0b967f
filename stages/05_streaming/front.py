"""A later stage's front end: stage 05's `LLM` held, not inherited.

Stages 06 and 07 change the engine (their ``build``) and add a little around it; everything a caller or the server
uses (``generate``, streams, the loop, the metrics) stays stage 05's. Held as ``self.front`` rather than subclassed,
stage 05's `LLM` is met by name and read with stage 05, and a later stage's file stays about its own idea. A name
the holder does not define is the front's; the server serves a holder as stage 05's `LLM` (server/app.py).
"""
from __future__ import annotations

from .engine import LLM


class HeldFrontEnd:
    front: LLM  # set first thing in the holder's constructor

    def __getattr__(self, name: str):
        if name == "front":  # asked before the constructor set it: not a name of the front's
            raise AttributeError(name)
        return getattr(self.front, name)

"""A later stage's front end: stage 05's `LLM` held, not inherited.

Stages 06 and 07 change the engine (their ``build``) and add a little around it (what speculation did, a grammar per
request); everything a caller or the server uses (``generate``, streams, the loop, the metrics) stays stage 05's.
Holding that front end as ``self.front`` instead of subclassing it keeps a later stage's file about its own idea: its
reader meets stage 05's `LLM` by name and reads it with stage 05. A name the holder does not define is the front's;
the server serves a holder as it serves stage 05's `LLM` (server/app.py).
"""
from __future__ import annotations

from .engine import LLM


class HeldFrontEnd:
    front: LLM  # set first thing in the holder's constructor

    def __getattr__(self, name: str):
        if name == "front":  # asked before the constructor set it: not a name of the front's
            raise AttributeError(name)
        return getattr(self.front, name)

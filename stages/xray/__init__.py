"""The engine's X-ray: a recording of every step (common/trace.py), a self-contained page that replays it (page.py),
the same data for Perfetto (chrome.py), and a live page in stage 05's server (live.py)."""
from common.trace import Recorder, StepEncoder, TraceError, load, save
from .replay import Frame, audit, replay

__all__ = ["Recorder", "StepEncoder", "TraceError", "load", "save", "Frame", "audit", "replay"]

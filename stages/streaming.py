"""Stage 05, streaming (the folder stages/05_streaming/), under a name an import statement can spell.

The folder is this module's package path: ``from stages.streaming.engine import build`` loads
stages/05_streaming/engine.py, once, as ``stages.streaming.engine``. Its number orders the lessons
(``python -m stages.05_streaming``); this name is how another stage, a test or an instrument imports it."""
from pathlib import Path

__path__ = [str(Path(__file__).with_name("05_streaming"))]

from stages.streaming.engine import LLM, build  # noqa: E402
from stages.streaming.front import HeldFrontEnd  # noqa: E402
from stages.streaming.streams import QueueFull, RequestStream, StreamChunk  # noqa: E402

__all__ = ["LLM", "HeldFrontEnd", "build", "QueueFull", "RequestStream", "StreamChunk"]

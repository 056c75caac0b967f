"""Stage 01, static batching (the folder stages/01_static_batch/), under a name an import statement can spell.

The folder is this module's package path: ``from stages.static_batch.engine import build`` loads
stages/01_static_batch/engine.py, once, as ``stages.static_batch.engine``. Its number orders the lessons
(``python -m stages.01_static_batch``); this name is how another stage, a test or an instrument imports it."""
from pathlib import Path

__path__ = [str(Path(__file__).with_name("01_static_batch"))]

from stages.static_batch.engine import LLM, BatchCache, Scheduler, build  # noqa: E402

__all__ = ["LLM", "BatchCache", "Scheduler", "build"]

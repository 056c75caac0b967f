"""Stage 02, continuous batching (the folder stages/02_continuous_batch/), under a name an import statement can spell.

The folder is this module's package path: ``from stages.continuous_batch.engine import build`` loads
stages/02_continuous_batch/engine.py, once, as ``stages.continuous_batch.engine``. Its number orders the lessons
(``python -m stages.02_continuous_batch``); this name is how another stage, a test or an instrument imports it."""
from pathlib import Path

__path__ = [str(Path(__file__).with_name("02_continuous_batch"))]

from stages.continuous_batch.engine import LLM, Scheduler, build  # noqa: E402

__all__ = ["LLM", "Scheduler", "build"]

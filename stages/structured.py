"""Stage 07, structured output (the folder stages/07_structured/), under a name an import statement can spell.

The folder is this module's package path: ``from stages.structured.engine import build`` loads
stages/07_structured/engine.py, once, as ``stages.structured.engine``. Its number orders the lessons
(``python -m stages.07_structured``); this name is how another stage, a test or an instrument imports it."""
from pathlib import Path

__path__ = [str(Path(__file__).with_name("07_structured"))]

from common.sampling import StructuredOutputsParams  # noqa: E402
from stages.structured.engine import LLM, StructuredOutputs, build  # noqa: E402

__all__ = ["StructuredOutputsParams", "LLM", "StructuredOutputs", "build"]

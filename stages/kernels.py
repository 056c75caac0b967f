"""Stage 04, fused kernels (the folder stages/04_kernels/), under a name an import statement can spell.

The folder is this module's package path: ``from stages.kernels.engine import build`` loads
stages/04_kernels/engine.py, once, as ``stages.kernels.engine``. Its number orders the lessons
(``python -m stages.04_kernels``); this name is how another stage, a test or an instrument imports it."""
from pathlib import Path

__path__ = [str(Path(__file__).with_name("04_kernels"))]

from stages.kernels.engine import LLM, build  # noqa: E402
from stages.kernels.kernel_cache import KernelPagedCache  # noqa: E402
from stages.kernels.model import KernelLlama, describe_path, kernels_available  # noqa: E402

__all__ = ["LLM", "build", "KernelPagedCache", "KernelLlama", "describe_path", "kernels_available"]

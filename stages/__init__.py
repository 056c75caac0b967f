"""The stages, each under a Python name, so one stage can build on another with a plain import:

    from stages import static_batch      # stages/01_static_batch/
    from stages import continuous_batch  # stages/02_continuous_batch/
    from stages import paged_kv          # stages/03_paged_kv/
    from stages import kernels           # stages/04_kernels/
    from stages import streaming         # stages/05_streaming/
    from stages import speculative       # stages/06_speculative/
    from stages import structured        # stages/07_structured/

A folder's number keeps the lesson order (``python -m stages.03_paged_kv``), but a name that begins
with a digit cannot be imported with ``import``; this registry maps each name to its folder and
imports a stage only when it is first asked for (so importing stage 02 never loads stage 05's server).
"""
from __future__ import annotations

import importlib
from types import ModuleType

STAGES = {
    "static_batch": "stages.01_static_batch",
    "continuous_batch": "stages.02_continuous_batch",
    "paged_kv": "stages.03_paged_kv",
    "kernels": "stages.04_kernels",
    "streaming": "stages.05_streaming",
    "speculative": "stages.06_speculative",
    "structured": "stages.07_structured",
}
__all__ = list(STAGES)


def __getattr__(name: str) -> ModuleType:
    if name not in STAGES:
        raise AttributeError(f"module 'stages' has no attribute {name!r}")
    module = importlib.import_module(STAGES[name])
    globals()[name] = module
    return module


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

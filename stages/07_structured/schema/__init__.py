"""JSON Schema as the grammar backends accept it: support stage 07 rests on, read apart from its lesson (README.md).

The backends call ``prepare`` before they compile a schema and ``with_check`` after; the rest of the stage never
looks inside. In vLLM this work lives inside xgrammar and llguidance, not in the engine.
"""
from __future__ import annotations

from .checked import with_check
from .compile_budget import CompileBudget, too_slow_reason
from .rewrites import Cleaned, Refused, clean
from .schema_check import guidance_refusal, loosens, xgrammar_reason, xgrammar_refusals

__all__ = ["prepare", "with_check", "Refused", "CompileBudget", "guidance_refusal", "loosens", "xgrammar_reason",
           "too_slow_reason"]


def prepare(schema, backend: str, compiler=None, loose: bool = False) -> Cleaned:
    """``schema`` as ``backend`` ("xgrammar" or "guidance") is given it, and the keywords left to the check of the
    finished output (``Cleaned.checked``); `Refused` naming a keyword it would not enforce. For xgrammar, which would
    skip such a keyword silently, the cleaned schema is read against its list (``compiler`` compiles a pattern
    alone); llguidance refuses by itself (``guidance_refusal``), and ``loose`` answers some of its refusals."""
    cleaned = clean(schema, backend, loose)
    if backend == "xgrammar":
        for problem in xgrammar_refusals(cleaned.schema, compiler):
            raise problem
    return cleaned

"""Stage 01: static batching. A batch runs until its longest request ends."""
from .engine import LLM, LLMEngine, Scheduler

__all__ = ["LLM", "LLMEngine", "Scheduler"]

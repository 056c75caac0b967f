"""Stage 01: static batching. A batch runs until its longest request ends."""
from .engine import LLM, Scheduler

__all__ = ["LLM", "Scheduler"]

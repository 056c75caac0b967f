"""Stage 02: continuous batching. A freed slot is refilled at every step."""
from .engine import LLM, LLMEngine, Scheduler

__all__ = ["LLM", "LLMEngine", "Scheduler"]

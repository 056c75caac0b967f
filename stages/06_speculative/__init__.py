"""Stage 06: speculative decoding. Proposers guess, one pass verifies, every token stays the reference's."""
from .config import SpeculativeConfig
from .engine import LLM, LLMEngine
from .scheduler import Scheduler

__all__ = ["LLM", "LLMEngine", "Scheduler", "SpeculativeConfig"]

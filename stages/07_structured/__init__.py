"""Stage 07: structured output. A JSON schema, a regex, a choice or a grammar masks the tokens that may come next."""
from common.sampling import StructuredOutputsParams

from .engine import LLM, LLMEngine, StructuredOutputs

__all__ = ["LLM", "LLMEngine", "StructuredOutputs", "StructuredOutputsParams"]

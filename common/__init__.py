"""What every stage shares: the model, its loader, tokenizer, sampler and the reference generator."""
from common.llm import LLM
from common.stats import EngineStats
from common.reference import ReferenceLLM
from common.sampling import SamplingParams
from common.sequence import RequestMetrics, RequestOutput, Sequence, SequenceStatus

__all__ = ["LLM", "EngineStats", "ReferenceLLM", "SamplingParams", "RequestMetrics",
           "RequestOutput", "Sequence", "SequenceStatus"]

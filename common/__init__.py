"""What every stage shares: the model, its loader, tokenizer, sampler and the reference generator."""
from common.llm import BaseLLM, EngineStats
from common.reference import ReferenceLLM
from common.sampling import SamplingParams
from common.sequence import RequestMetrics, RequestOutput, Sequence, SequenceStatus

__all__ = ["BaseLLM", "EngineStats", "ReferenceLLM", "SamplingParams", "RequestMetrics",
           "RequestOutput", "Sequence", "SequenceStatus"]

"""Stage 07: structured output. A grammar decides which tokens may come next.

The previous stage's engine with one idea added: a request may carry a constraint (``SamplingParams(
structured_outputs=...)``: a JSON schema, a regex, a choice, a grammar) and then gets a `GrammarConstraint` among its
logits processors, which masks every token the grammar does not allow at that position (constraint.py). The
engine itself changes in two small places: its runner reports log-probabilities of the masked distribution (vLLM's
``processed_logprobs``), and its scheduler feeds the tokens a grammar forces as drafts, verified in one step by
stage 06's exact match (forced.py). Everything else (batching, paging, kernels, streaming, speculation for the
requests without a constraint) is the previous stage's.
"""
from __future__ import annotations

from common.processors import LogitsProcessor
from common.sampling import SamplingParams
from common.sequence import Sequence
from common.validate import InvalidParam, check_int
from stages import speculative as previous

from .backends import grammars_for
from .constraint import GrammarConstraint, single_token
from .forced import ForcedTokens, constraint_of

__all__ = ["LLM", "LLMEngine", "StructuredOutputs"]


class StructuredOutputs:
    """What any front end (`common.llm.LLM` subclass) needs to apply ``structured_outputs``: mixed in first, as this
    stage does and as the tests do for the reference and stages 03-06 (the same constraint, the same arithmetic)."""
    structured_backend = "auto"  # "fsm" (the hand-written automaton) or "xgrammar" to force one

    def constraint_processors(self, params: SamplingParams, seq: Sequence) -> list[LogitsProcessor]:
        so = params.structured_outputs
        if so is None:
            return []
        eos = tuple(sorted(seq.eos_token_ids))
        grammars = grammars_for(str(self.folder), self.config.vocab_size, eos)
        grammar = grammars.compile(so, self.structured_backend)
        masking = params.allowed_token_ids is not None or bool(params.bad_words) or params.min_tokens > 0
        rule = GrammarConstraint(grammar.matcher(), list(eos), self.config.vocab_size, check_empty=masking)
        if params.allowed_token_ids is not None:  # the one conflict visible before the first step
            first = rule.mask()
            allowed = [t for t in params.allowed_token_ids if first[t // 32] >> (t % 32) & 1]
            if not allowed:
                example = single_token(first)
                raise InvalidParam("allowed_token_ids", "no token of allowed_token_ids can begin an output that "
                                   f"structured_outputs allows ({so.kind}"
                                   f"{f', whose first token must be {example}' if example is not None else ''}): "
                                   "widen allowed_token_ids or drop it")
        return [rule]


class Scheduler(previous.LLM.engine_class.scheduler_class):
    """Stage 06's scheduler with one more proposer: a request with a constraint drafts the tokens its grammar
    forces (up to ``max_forced`` a step; stage 06's caps on budget, blocks and max_tokens apply as to any draft)."""
    forced = ForcedTokens()
    max_forced = 16  # stage 07's engine option num_forced_tokens

    def draft_limit(self, seq: Sequence) -> int:
        return self.max_forced if constraint_of(seq) is not None else super().draft_limit(seq)

    def proposer_for(self, seq: Sequence):
        return self.forced if constraint_of(seq) is not None else super().proposer_for(seq)


class LLMEngine(previous.LLM.engine_class):
    scheduler_class = Scheduler

    def __init__(self, model, *, num_forced_tokens: int = 16, **options):
        """num_forced_tokens: the most tokens a grammar may force into one step of a request (0: one token a step,
        plain masked decoding)."""
        check_int("num_forced_tokens", num_forced_tokens, 0, 256)
        super().__init__(model, **options)
        self.scheduler.max_forced = num_forced_tokens
        self.runner.logprobs_mode = "processed_logprobs"  # what the request was sampled from: the masked logits


class LLM(StructuredOutputs, previous.LLM):
    engine_class = LLMEngine

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.engine.scheduler.forced = ForcedTokens(self.tokenizer.encode)  # this LLM's, with its tokenizer

"""Stage 07: structured output. A grammar decides which tokens may come next.

Stage 06's engine with one idea added: a request may carry a constraint (``SamplingParams(structured_outputs=...)``:
a JSON schema, a regex, a choice, a grammar) and then gets a `GrammarConstraint` among its logits processors, which
masks every token the grammar does not allow (constraint.py). Two parts change: the runner masks a step's
constrained rows together and reports the masked distribution's log-probabilities (masks.py), and stage 06's
scheduler gets one more proposer at the front: the tokens a grammar forces, fed as drafts (forced.py). Everything
else (batching, paging, kernels, streaming, speculation for the other requests) is the earlier stages'.
"""
from __future__ import annotations

from types import MappingProxyType

from common.engine import LLMEngine
from common.engine_config import EngineConfig
from common.paths import DEFAULT_MODEL
from common.processors import LogitsProcessor
from common.requests import Request
from common.sampling import SamplingParams
from common.tokenizer import Tokenizer
from common.validate import InvalidParam
from stages.kernels import KernelLlama  # stage 04: model.py
from stages.paged_kv import kv_blocks  # stage 03: kv_budget.py
from stages.speculative import (STAGE_DEFAULT, SpeculativeScheduler, paged_cache, speculative_policy,  # stage 06
                                speculative_proposers)
from stages.streaming import LLM as StreamingLLM, HeldFrontEnd  # stage 05: engine.py, front.py

from .backends import cache_stats, grammars_for
from .constraint import GrammarConstraint, single_token
from .forced import ForcedTokens
from .masks import BatchMasks, StructuredRunner

__all__ = ["LLM", "StructuredOutputs", "build"]


def build(config: EngineConfig, tokenizer: Tokenizer) -> LLMEngine:
    """Stage 06's engine with the grammar's forced tokens as its first proposer, and masked log-probabilities."""
    model = config.model.load(KernelLlama)  # stage 04
    blocks = kv_blocks(config, model)  # stage 03
    cfg = config.structured_outputs
    masks = BatchMasks(model.config.vocab_size)  # masks.py: a step's masks filled in one call per backend
    proposers = [ForcedTokens(cfg.num_forced_tokens, tokenizer.encode, cfg.forced_budget_us, masks),  # forced.py
                 *speculative_proposers(config, tokenizer, model, blocks)]  # stage 06's, for the other requests
    return LLMEngine(model, SpeculativeScheduler(config.scheduler, blocks, proposers,  # stage 06's scheduler
                                                 speculative_policy(config, cfg.num_forced_tokens > 0)),  # priced
                     paged_cache(model, blocks, config.cache.fused_attention),  # stage 04's cache
                     StructuredRunner(model, masks))  # masks.py: masks applied at once


class StructuredOutputs:
    """What any front end needs to apply ``structured_outputs``: mixed into a `common.llm.LLM` subclass (the tests
    do, for the reference and stages 03-06), or its ``constraint_processors`` given to a held front end (this `LLM`)."""

    def constraint_processors(self, params: SamplingParams, request: Request) -> list[LogitsProcessor]:
        so = params.structured_outputs
        if so is None:
            return []
        eos = tuple(sorted(request.eos_token_ids))
        options = self.engine_config.structured_outputs
        grammars = grammars_for(str(self.folder), self.config.vocab_size, eos, options.grammar_cache_bytes)
        grammar = grammars.compile(so, options.backend, options.compile_budget_s)  # off the engine's thread
        masking = params.allowed_token_ids is not None or bool(params.bad_words) or params.min_tokens > 0
        rule = GrammarConstraint(grammar.matcher(), list(eos), self.config.vocab_size, check_empty=masking)
        first = rule.mask()  # computed here, on the thread that prepares the request, and kept for its first step
        if not first.any():  # nothing may begin the output and the empty one is not allowed: no string matches
            raise InvalidParam("structured_outputs", f"structured_outputs ({so.kind}) admits no output at all: no "
                                                     "token may begin it and it does not allow the empty string; "
                                                     "fix the constraint so that some text matches it")
        if params.allowed_token_ids is not None:  # the one conflict with the request's other rules visible up front
            allowed = [t for t in params.allowed_token_ids if first[t // 32] >> (t % 32) & 1]
            if not allowed:
                example = single_token(first)
                raise InvalidParam("allowed_token_ids", "no token of allowed_token_ids can begin an output that "
                                   f"structured_outputs allows ({so.kind}"
                                   f"{f', whose first token must be {example}' if example is not None else ''}): "
                                   "widen allowed_token_ids or drop it")
        return [rule]


class LLM(StructuredOutputs, HeldFrontEnd):
    """Stage 05's front end (``self.front``: streams, loop, server) over this stage's engine, each request's
    constraint from `StructuredOutputs` (given as ``constraints``)."""
    build = staticmethod(build)
    command_line_defaults = MappingProxyType({"speculative_config": STAGE_DEFAULT})  # stages/cli.py's make_llm

    def __init__(self, model: str = DEFAULT_MODEL, **options):
        self.front = StreamingLLM(model, build=build, constraints=self.constraint_processors, **options)

    def server_gauges(self) -> dict[str, tuple[float, str]]:
        """Stage 05's gauges and the compiled-grammar cache's size (grammar_cache.py), for /metrics."""
        stats = cache_stats(str(self.folder), self.engine_config.structured_outputs.grammar_cache_bytes)
        return self.front.server_gauges() | {
            "stepwise_grammar_cache_bytes": (stats["bytes"], "Compiled grammars kept, bytes (estimated)"),
            "stepwise_grammar_cache_max_bytes": (stats["max_bytes"], "The grammar cache's bound, bytes"),
            "stepwise_grammar_cache_entries": (stats["entries"], "Compiled grammars kept"),
            "stepwise_grammar_cache_evictions": (stats["evictions"], "Grammars dropped to stay under the bound")}

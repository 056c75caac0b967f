"""Stage 06: speculative decoding. Guess several tokens, check them in one pass, keep every token identical.

Decoding one request reads every weight once per token, so a pass over k + 1 tokens of one request costs about
what a pass over one does. Stage 05's engine with one idea added: before each step a proposer guesses up to k next
tokens of each decoding request (`Scheduler.propose_drafts`); the step feeds them after the request's own token;
the runner samples every position and keeps the guesses up to the first that differs from what it sampled there,
plus that one token (``ModelRunner.sample_run``: exact-match verification, so the kept tokens are exactly those
one-at-a-time decoding gives, greedy or seeded); the KV slots of the rest go back (`BlockManager.truncate`).
"""
from __future__ import annotations

from common.loader import load_model
from common.paths import DEFAULT_MODEL
from common.prepare import resolve_model
from stages import streaming

from .config import STAGE_DEFAULT, SpeculativeConfig
from .draft_model import DraftModelProposer
from .proposers import NgramProposer, PredictionProposer
from .scheduler import Scheduler
from .spec_stats import SpecStats


class LLMEngine(streaming.engine.LLMEngine):
    scheduler_class = Scheduler

    def release(self) -> None:
        """Drop every request, and what the proposers hold for them (the draft model's KV blocks)."""
        super().release()
        for proposer in (self.scheduler.proposer, self.scheduler.predictions):
            if proposer is not None:
                proposer.release()


class LLM(streaming.LLM):
    engine_class = LLMEngine
    # What the shared command line and the ladder run stage 06 with (stages/cli.py's make_llm): prompt lookup.
    default_speculative_config = STAGE_DEFAULT

    def __init__(self, model: str = DEFAULT_MODEL, *, speculative_config: dict | str | None = None, **kwargs):
        self.speculative_config = SpeculativeConfig.parse(speculative_config)  # before the model loads
        super().__init__(model, **kwargs)
        config, scheduler = self.speculative_config, self.engine.scheduler
        if config is not None:
            config.check_budget(self.engine.max_num_batched_tokens)
            scheduler.num_speculative_tokens = config.num_speculative_tokens
            scheduler.disable_by_batch_size = config.disable_by_batch_size
            scheduler.proposer = self.make_proposer(config)
            scheduler.predictions = PredictionProposer(self.tokenizer)
        self.spec_stats = self.add_observer(SpecStats(scheduler))

    def make_proposer(self, config: SpeculativeConfig):
        if config.method == "ngram":
            return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        engine = self.engine
        dtype = "bfloat16" if config.quantization else self.dtype  # quantized weights compute in bfloat16
        draft = load_model(resolve_model(config.model) if config.model else self.folder, dtype, self.device,
                           engine.model_class, self.batch_invariant, config.quantization)
        if draft.config.vocab_size != self.config.vocab_size:
            raise ValueError(f"speculative_config.model has a vocabulary of {draft.config.vocab_size} tokens, the "
                             f"model {self.config.vocab_size}: a draft model must share the tokenizer")
        return DraftModelProposer(draft, engine.cache_class, engine.block_manager.num_blocks, engine.block_size,
                                  engine.max_num_batched_tokens)

    def describe(self) -> str:
        """The line the stage prints first: what runs, and on which path (the figures depend on it)."""
        spec = self.speculative_config.describe() if self.speculative_config else "off"
        weights = f" ({self.quantization} weights)" if self.quantization else ""
        proposer = self.engine.scheduler.proposer
        draft = f"; the draft's {proposer.model.row_tile_note}" if isinstance(proposer, DraftModelProposer) else ""
        return (f"stage 06 on {self.execution_path}, {self.dtype}{weights}; speculation: {spec}; "
                f"{self.model.row_tile_note}{draft}")

    def generate(self, *args, **kwargs):
        self.spec_stats.reset()
        return super().generate(*args, **kwargs)

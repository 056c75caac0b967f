"""Stage 06: speculative decoding. Guess several tokens, check them in one pass, keep every token identical.

Decoding one request reads every weight once per token, so a pass over k + 1 tokens of one request costs about what a
pass over one does. Stage 05's engine with one idea added: before each step a proposer guesses up to k next tokens of
each decoding request (`SpeculativeScheduler.propose_drafts`), fed after its own token; the runner keeps them up to
the first that differs from what it sampled, plus that token (``ModelRunner.sample_run``: exact-match verification,
so the tokens are one-at-a-time decoding's, greedy or seeded); the rest's KV goes back (`BlockManager.truncate`).
"""
from __future__ import annotations

from types import MappingProxyType

from common.engine import LLMEngine
from common.engine_config import EngineConfig
from common.paths import DEFAULT_MODEL
from common.prepare import resolve_model
from common.runner import ModelRunner
from common.tokenizer import Tokenizer
from stages.kernels import KernelLlama, KernelPagedCache  # stage 04: model.py, kernel_cache.py
from stages.paged_kv import BlockManager, kv_blocks  # stage 03: block_manager.py, kv_budget.py
from stages.streaming import LLM as StreamingLLM, HeldFrontEnd  # stage 05: engine.py, front.py

from .calibration import calibrate
from .cost_model import AdaptiveDrafts
from .defaults import STAGE_DEFAULT
from .draft_model import DraftModelProposer
from .proposer import Proposer
from .proposers import NgramProposer, PredictionProposer
from .scheduler import SpeculativeScheduler
from .spec_stats import SpecStats
from .suffix import SuffixProposer


def paged_cache(model: KernelLlama, blocks: BlockManager, fused_attention: bool = False) -> KernelPagedCache:
    return KernelPagedCache(model.config, blocks.num_blocks, blocks.block_size, model.dtype, model.device,
                            model.batch_invariant, fused_attention=fused_attention)  # stage 04


def speculative_proposers(config: EngineConfig, tokenizer: Tokenizer, model: KernelLlama,
                          blocks: BlockManager) -> list[Proposer]:
    """What ``speculative_config`` drafts with, in order: a request's predicted output, then the method's proposer."""
    spec = config.speculative
    if spec is None:
        return []
    k, off = spec.num_speculative_tokens, spec.disable_by_batch_size
    if spec.method == "ngram":
        method = NgramProposer(k, spec.prompt_lookup_min, spec.prompt_lookup_max, off, spec.prompt_lookup_spec_factor)
    elif spec.method == "suffix":
        method = SuffixProposer(k, **spec.suffix_options, disable_by_batch_size=off)  # suffix.py
    else:
        folder = str(resolve_model(spec.model)) if spec.model else config.model.folder
        dtype = "bfloat16" if spec.quantization else config.model.dtype  # quantized weights compute in bfloat16
        draft = config.model.load(KernelLlama, spec.draft_num_layers,  # None: all layers; N: early exit
                                  folder=folder, dtype=dtype, quantization=spec.quantization)
        if draft.config.vocab_size != model.config.vocab_size:
            raise ValueError(f"speculative_config.model has a vocabulary of {draft.config.vocab_size} tokens, the "
                             f"model {model.config.vocab_size}: a draft model must share the tokenizer")
        own = BlockManager(blocks.num_blocks, blocks.block_size)  # stage 03's, for the draft's own KV
        budget = config.scheduler.max_num_batched_tokens
        method = DraftModelProposer(draft, paged_cache(draft, own), own, budget, k, off)
    return [PredictionProposer(tokenizer, spec.prediction_k, off), method]


def speculative_policy(config: EngineConfig, forced: bool = False) -> AdaptiveDrafts | None:
    """The adaptive policy (cost_model.py) unless ``enable_adaptive_verification`` is off (every draft fed)."""
    spec = config.speculative  # None: a policy where ``forced`` (stage 07's forced tokens, drafts priced alike)
    return AdaptiveDrafts() if (spec.enable_adaptive_verification if spec is not None else forced) else None


def build(config: EngineConfig, tokenizer: Tokenizer) -> LLMEngine:
    """Stage 04's engine (stage 03's paging, stage 04's kernels) with this stage's scheduler and proposers."""
    model = config.model.load(KernelLlama)  # stage 04
    blocks = kv_blocks(config, model)  # stage 03: the block pool and its prefix cache
    proposers = speculative_proposers(config, tokenizer, model, blocks)  # proposers.py, draft_model.py
    scheduler = SpeculativeScheduler(config.scheduler, blocks, proposers,  # scheduler.py: stage 03's, and drafts
                                     speculative_policy(config))  # cost_model.py
    return LLMEngine(model, scheduler, paged_cache(model, blocks, config.cache.fused_attention), ModelRunner(model))


class LLM(HeldFrontEnd):
    """Stage 05's front end (``self.front``) over this engine, counting ``spec_stats``, calibrated at start."""
    build = staticmethod(build)
    command_line_defaults = MappingProxyType({"speculative_config": STAGE_DEFAULT})  # stages/cli.py's make_llm

    def __init__(self, model: str = DEFAULT_MODEL, **options):
        self.front = StreamingLLM(model, build=build, **options)
        self.spec_stats = self.front.add_observer(SpecStats())
        calibrate(self.front)

    def generate(self, *args, **kwargs):
        self.spec_stats.reset()
        return self.front.generate(*args, **kwargs)

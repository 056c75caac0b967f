"""One `EngineConfig` per engine: every option of ``LLM(...)``, the command lines and the server, checked once,
before the model loads, then handed to the parts, each of which reads its section. Frozen: nothing changes it after.

    model               ModelOptions             the checkpoint folder, its precision, device and context
    scheduler           SchedulerConfig          max_num_seqs, max_num_batched_tokens, chunked prefill, preemption
    cache               CacheConfig              block_size, the KV budget, prefix caching, fused decode attention
    speculative         SpeculativeConfig|None   speculative_config: what stage 06 drafts with (None: nothing)
    structured_outputs  StructuredOutputsConfig  the grammar backend and the forced tokens of stage 07

The option names are vLLM's. Every stage takes every option, and reads the sections of the parts it is built from.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from common.config import ModelConfig
from common.loader import load_model, parse_dtype, parse_memory, resolve_device
from common.model import Llama
from common.paths import DEFAULT_MODEL
from common.speculative_config import SpeculativeConfig
from common.validate import InvalidParam, check_bool, check_int, clip


@dataclass(frozen=True)
class ModelOptions:
    folder: str  # the checkpoint folder (a name like 'tiny' resolved to it)
    dtype: torch.dtype
    device: torch.device
    max_model_len: int  # the most tokens a request may hold, prompt and output
    quantization: str | None = None  # None, 'int8', 'int4' or 'w4a8' (common.numerics.quant)
    seed: int = 0
    batch_invariant: bool = True  # False: plain torch math, faster, but a request's tokens depend on its batch

    def load(self, model_class: type[Llama] = Llama, num_layers: int | None = None, **changes) -> Llama:
        """The checkpoint's weights in a stage's model class (``changes``: another folder, dtype or quantization,
        for a draft model; ``num_layers``: its first layers only, an early-exit draft)."""
        m = replace(self, **changes)
        return load_model(m.folder, m.dtype, m.device, model_class, m.batch_invariant, m.quantization, num_layers)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 16  # requests in flight (stages 01-02: batch slots)
    max_num_batched_tokens: int = 512  # tokens one step feeds (stage 03 on)
    max_model_len: int | None = None  # the model's context, for a request's longest growth
    enable_chunked_prefill: bool = True
    enable_preemption: bool = True
    max_waiting: int = 256  # requests queued past which a server answers 503 (stage 05 on)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block (stage 03 on)
    kv_cache_memory: str | int | float | None = None  # bytes, '48MiB', a fraction of free memory; None: as stage 02
    enable_prefix_caching: bool = True
    fused_attention: bool = False  # stage 04 on CUDA: decode attention in a Triton kernel (not the reference's bits)


@dataclass(frozen=True)
class StructuredOutputsConfig:
    backend: str = "auto"  # 'auto', 'xgrammar', 'guidance' (llguidance) or 'fsm' (the hand-written automaton)
    num_forced_tokens: int = 16  # the most tokens a grammar may force into one step of a request (0: none)
    grammar_cache_bytes: int = 256 * 2**20  # compiled grammars kept, least recently used out first (grammar_cache.py)
    compile_budget_s: float = 2.0  # a grammar not compiled by then fails its request alone (compile_budget.py)
    forced_budget_us: float | None = 2000.0  # the forced look-ahead's time a step, started within it (None: no bound)


@dataclass(frozen=True)
class EngineConfig:
    model: ModelOptions
    scheduler: SchedulerConfig
    cache: CacheConfig
    speculative: SpeculativeConfig | None = None
    structured_outputs: StructuredOutputsConfig = StructuredOutputsConfig()

    @classmethod
    def create(cls, model: str | os.PathLike = DEFAULT_MODEL, *, dtype: str = "bfloat16", device: str | None = "auto",
               max_model_len: int | None = None, max_num_seqs: int = 16, seed: int = 0, batch_invariant: bool = True,
               quantization: str | None = None, block_size: int = 16, kv_cache_memory: str | int | float | None = None,
               kv_cache_memory_bytes: int | None = None, max_num_batched_tokens: int = 512,
               enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True, enable_preemption: bool = True,
               fused_attention: bool = False, max_waiting: int = 256, speculative_config=None,
               num_forced_tokens: int = 16, structured_outputs_config: dict | None = None,
               structured_outputs_backend: str | None = None, grammar_cache_mb: float = 256,
               grammar_compile_budget_s: float = 2.0, forced_budget_us: float | None = 2000.0) -> EngineConfig:
        """Check every option (a wrong one raises `InvalidParam` naming it) and resolve the model's folder and
        context; the weights are not read."""
        if max_model_len is not None:
            check_int("max_model_len", max_model_len, 2)
        check_int("max_num_seqs", max_num_seqs, 1)
        check_int("seed", seed, 0, 2**64 - 1)
        if not isinstance(model, (str, os.PathLike)):
            raise InvalidParam("model", f"model={clip(model)} is invalid: give a checkpoint folder or a model name")
        check_int("block_size", block_size, 1)  # 16 is the usual choice
        check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        for name, flag in (("batch_invariant", batch_invariant), ("enable_prefix_caching", enable_prefix_caching),
                           ("enable_chunked_prefill", enable_chunked_prefill),
                           ("enable_preemption", enable_preemption), ("fused_attention", fused_attention)):
            check_bool(name, flag)
        if max_num_batched_tokens < max_num_seqs:
            raise InvalidParam("max_num_batched_tokens", f"max_num_batched_tokens={max_num_batched_tokens} must be "
                               f">= max_num_seqs={max_num_seqs}, or some running requests could never decode")
        check_int("max_waiting", max_waiting, 1)
        check_int("num_forced_tokens", num_forced_tokens, 0, 256)
        backend = structured_backend(structured_outputs_config, structured_outputs_backend)
        for name, value, ok, fix in (  # each a number (not a bool) in its range, or an error saying what to give
                ("grammar_cache_mb", grammar_cache_mb, lambda v: 0 < v <= 2**20,
                 "the MiB of compiled grammars to keep, > 0"),
                ("grammar_compile_budget_s", grammar_compile_budget_s, lambda v: 0 < v <= 3600,
                 "the seconds a grammar may take to compile, > 0 and <= 3600"),
                ("forced_budget_us", 0 if forced_budget_us is None else forced_budget_us, lambda v: 0 <= v <= 1e9,
                 "the µs of forced-token look-ahead a step, >= 0 (None: no bound)")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise InvalidParam(name, f"{name}={clip(value)} is invalid: give {fix}")
        speculative = SpeculativeConfig.parse(speculative_config)
        if speculative is not None:
            speculative.check_budget(max_num_batched_tokens)
        device = resolve_device(device)
        cache = CacheConfig(block_size, kv_budget(kv_cache_memory, kv_cache_memory_bytes, device),
                            enable_prefix_caching, fused_attention)
        from common.prepare import resolve_model  # lazily: `python -m common.prepare` imports common first
        folder = resolve_model(model)
        context = model_context(ModelConfig.from_folder(folder), max_model_len)
        if speculative is not None and speculative.draft_num_layers is not None:  # early exit: within the draft's
            draft = resolve_model(speculative.model) if speculative.model else folder
            speculative.check_layers(ModelConfig.from_folder(draft).num_hidden_layers)
        return cls(ModelOptions(str(folder), parse_dtype(dtype), device, context, quantization, seed, batch_invariant),
                   SchedulerConfig(max_num_seqs, max_num_batched_tokens, context, enable_chunked_prefill,
                                   enable_preemption, max_waiting),
                   cache, speculative, StructuredOutputsConfig(
                       backend, num_forced_tokens, int(grammar_cache_mb * 2**20), float(grammar_compile_budget_s),
                       None if forced_budget_us is None else float(forced_budget_us)))


BACKENDS = ("auto", "xgrammar", "guidance", "fsm")  # vLLM's names (its "guidance" is llguidance)


def structured_backend(config: dict | None, backend: str | None) -> str:
    """vLLM's ``structured_outputs_config={"backend": ...}`` (or the older flat keyword): the grammar backend."""
    if config is not None and (not isinstance(config, dict) or set(config) - {"backend"}):
        raise InvalidParam("structured_outputs_config", f"structured_outputs_config={clip(config)} is invalid: give "
                                                        f'{{"backend": one of {", ".join(BACKENDS)}}}')
    name = (config or {}).get("backend", backend if backend is not None else "auto")
    if name not in BACKENDS:
        raise InvalidParam("structured_outputs_config", f"structured_outputs_config.backend={clip(name)} is invalid: "
                                                        f"use {', '.join(map(repr, BACKENDS))}")
    return name


def kv_budget(kv_cache_memory, kv_cache_memory_bytes, device: torch.device):
    """The KV budget as given, once it reads (a fraction of free memory is measured again once the weights are in)."""
    if kv_cache_memory_bytes is not None:  # vLLM's name: a plain byte count
        if kv_cache_memory is not None:
            raise InvalidParam("kv_cache_memory_bytes", "give kv_cache_memory_bytes or kv_cache_memory, not both")
        check_int("kv_cache_memory_bytes", kv_cache_memory_bytes, 1)
        kv_cache_memory = kv_cache_memory_bytes
    try:  # bytes, "48MiB", "2GB", or a fraction of free memory like 0.5
        budget = parse_memory(kv_cache_memory, device)
    except (ValueError, TypeError) as e:
        raise InvalidParam("kv_cache_memory", f"kv_cache_memory={clip(kv_cache_memory)} is invalid: {e}") from None
    if budget is not None:
        check_int("kv_cache_memory", budget, 1)
    return kv_cache_memory


def context_note(config: ModelConfig) -> str:
    """What to say when a request outgrows a context that is the model's sliding window."""
    window = config.sliding_window
    if window is None or window != config.max_position_embeddings:
        return ""
    return (f" (the model's sliding window: stepwise's attention is full attention, which is sliding-window "
            f"attention only within the window's {window} tokens)")


def model_context(config: ModelConfig, max_model_len: int | None) -> int:
    """max_model_len checked against the model's context; by default the context, at most 2,048 tokens (a per-slot
    reservation, stage 02, stays affordable)."""
    limit = config.max_position_embeddings
    if max_model_len is not None:
        try:
            check_int("max_model_len", max_model_len, 2, limit)
        except InvalidParam as e:
            raise InvalidParam("max_model_len", f"{e}{context_note(config)}") from None
    return max_model_len or min(limit, 2048)

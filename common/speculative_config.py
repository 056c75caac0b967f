"""The speculation section of `EngineConfig` (``speculative_config``): vLLM's keys, checked before the model loads,
each error naming the key to fix. Stage 06 (stages/06_speculative/) reads it to choose its proposers.

    LLM(..., speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                 "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    LLM(..., speculative_config={"method": "draft_model", "num_speculative_tokens": 4})  # int4 copy of the model
    LLM(..., speculative_config={"method": "draft_model", "num_speculative_tokens": 4,  # its first 8 layers and the
                                 "draft_num_layers": 8})                               # head (early exit)
    LLM(..., speculative_config={"method": "suffix", "num_speculative_tokens": 8,  # suffix trees, vLLM's keys
                                 "suffix_decoding_max_tree_depth": 24, "suffix_decoding_min_token_prob": 0.1})

Whatever the method, drafts are fed where the adaptive policy finds they pay (``enable_adaptive_verification``,
on by default here) unless it is set to False (every draft fed) or ``disable_by_batch_size`` stops them.

A request's predicted output (``SamplingParams.prediction``, OpenAI's predicted outputs) is its own draft
whichever method is set; without a ``speculative_config`` nothing is drafted at all (stage 05).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from common.validate import InvalidParam, check_bool, check_int, clip

METHODS = ("ngram", "draft_model", "suffix")
# Past 16 drafts the later positions are almost never accepted, while every one of them is a row to verify.
MAX_SPECULATIVE_TOKENS = 16
KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model", "quantization",
        "draft_num_layers", "disable_by_batch_size", "enable_adaptive_verification",
        "prediction_num_speculative_tokens", "prompt_lookup_spec_factor", *(f"suffix_decoding_{k}" for k in
                                               ("max_tree_depth", "max_cached_requests", "max_spec_factor",
                                                "min_token_prob"))}
# vLLM's defaults for method "suffix" (vllm/config/speculative.py): tree depth 24, 10,000 cached answers, drafts of up
# to 1.0 x the match's length, tokens of estimated probability >= 0.1.
SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}
NGRAM_DEFAULT = 5  # vLLM's prompt_lookup_min and _max when neither is given


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None  # ngram: the shortest suffix of the text to look up
    prompt_lookup_max: int | None = None  # ngram: the longest (the longest that matches wins)
    model: str | None = None  # draft_model: its checkpoint (default: the target's own folder)
    quantization: str | None = None  # draft_model: its weights ("int4" by default: the same model, 4 bits)
    # vLLM's key: no drafts while more requests than this run (batching fills the step: speculation stops paying)
    disable_by_batch_size: int | None = None
    # vLLM's key (off by default there): feed only the drafts worth their rows, by a step-cost model measured on
    # this machine and each request's acceptance (stages/06_speculative/cost_model.py). On by default here: on a
    # CPU the rows of a verify pass are seldom free, and a fixed disable_by_batch_size suits one machine only.
    enable_adaptive_verification: bool = True
    suffix: tuple = ()  # suffix: (max_tree_depth, max_cached_requests, max_spec_factor, min_token_prob)
    # draft_model: its first N decoder layers, then its final norm and head (early exit); None: every layer
    draft_num_layers: int | None = None
    # Ours (no vLLM key): the most drafts a request's predicted output offers a step; None: num_speculative_tokens.
    # A prediction agrees for long runs, so more may pay where the adaptive policy finds the rows cheap.
    prediction_num_speculative_tokens: int | None = None
    # Ours (no vLLM key), ngram: a match of n tokens drafts at most factor x n (suffix decoding's
    # max_spec_factor: a long match is a copy, a 1-token one a guess); None: vLLM's rule, k drafts whatever n.
    prompt_lookup_spec_factor: float | None = None

    @classmethod
    def parse(cls, value) -> SpeculativeConfig | None:
        """None (speculation off), a dict of vLLM's keys, the same as a JSON string (the command line's), or a
        `SpeculativeConfig` already checked."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise InvalidParam("speculative_config", f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise InvalidParam("speculative_config", f"speculative_config={clip(value)} is invalid: give a dict "
                                                     f"such as {{'method': 'ngram', 'num_speculative_tokens': 4}}")
        unknown = sorted(str(k) for k in value if k not in KEYS)
        if unknown:
            raise InvalidParam(f"speculative_config.{unknown[0]}", f"speculative_config has unknown key(s) "
                               f"{clip(unknown)}; known: {', '.join(sorted(KEYS))}")
        method = value.get("method")
        if method not in METHODS:
            raise InvalidParam("speculative_config.method", f"speculative_config.method={clip(method)} is invalid: "
                               f"use one of {', '.join(repr(m) for m in METHODS)}")
        if "num_speculative_tokens" not in value:
            raise InvalidParam("speculative_config.num_speculative_tokens",
                               "speculative_config needs num_speculative_tokens: how many tokens to draft per step "
                               f"(1 to {MAX_SPECULATIVE_TOKENS})")
        k = value["num_speculative_tokens"]
        check_int("speculative_config.num_speculative_tokens", k, 1, MAX_SPECULATIVE_TOKENS)
        lo, hi = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
        if method == "ngram":
            if lo is None and hi is None:
                lo = hi = NGRAM_DEFAULT
            elif lo is None or hi is None:  # one given: both are it
                lo = hi = hi if lo is None else lo
            check_int("speculative_config.prompt_lookup_min", lo, 1)
            check_int("speculative_config.prompt_lookup_max", hi, 1)
            if lo > hi:
                raise InvalidParam("speculative_config.prompt_lookup_min", f"speculative_config.prompt_lookup_min="
                                   f"{lo} must be <= prompt_lookup_max={hi}")
        else:
            for key in ("prompt_lookup_min", "prompt_lookup_max", "prompt_lookup_spec_factor"):
                if value.get(key) is not None:
                    raise InvalidParam(f"speculative_config.{key}", f"speculative_config.{key} applies to method "
                                       f"'ngram' only, not {method!r}")
        if method != "draft_model":
            for key in ("model", "quantization", "draft_num_layers"):
                if value.get(key) is not None:
                    raise InvalidParam(f"speculative_config.{key}", f"speculative_config.{key} applies to method "
                                       f"'draft_model' only, not {method!r}")
        quantization = value.get("quantization", "int4" if method == "draft_model" else None)
        if method == "draft_model" and quantization not in (None, "int8", "int4", "w4a8"):
            raise InvalidParam("speculative_config.quantization", f"speculative_config.quantization="
                               f"{clip(quantization)} is invalid: use 'int4', 'w4a8', 'int8' or None (the model's "
                               f"dtype)")
        off = value.get("disable_by_batch_size")
        if off is not None:
            check_int("speculative_config.disable_by_batch_size", off, 1)
        adaptive = value.get("enable_adaptive_verification", True)
        check_bool("speculative_config.enable_adaptive_verification", adaptive)
        layers = value.get("draft_num_layers")
        if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool) or layers < 1):
            raise InvalidParam("speculative_config.draft_num_layers", f"speculative_config.draft_num_layers="
                               f"{clip(layers)} is invalid: give an integer from 1 to the draft's num_hidden_layers")
        suffix = suffix_options(method, value)
        predicted = value.get("prediction_num_speculative_tokens")
        if predicted is not None:
            check_int("speculative_config.prediction_num_speculative_tokens", predicted, 1, MAX_SPECULATIVE_TOKENS)
        factor = value.get("prompt_lookup_spec_factor")
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not 0 < factor <= 64):
            raise InvalidParam("speculative_config.prompt_lookup_spec_factor", f"speculative_config.prompt_lookup_spec_"
                               f"factor={clip(factor)} is invalid: give a number above 0 to 64 (2: a match of n tokens "
                               f"drafts at most 2n)")
        return cls(method, k, lo, hi, value.get("model"), quantization, off, adaptive, suffix, layers, predicted,
                   factor)

    @property
    def prediction_k(self) -> int:
        """The most drafts a predicted output offers a step."""
        return self.prediction_num_speculative_tokens or self.num_speculative_tokens

    @property
    def max_drafts(self) -> int:
        """The most drafts any request may feed a step (a prediction's or the method's)."""
        return max(self.prediction_k, self.num_speculative_tokens)

    @property
    def suffix_options(self) -> dict:
        return dict(zip(("depth", "max_cached_requests", "factor", "min_prob"), self.suffix))

    def check_budget(self, max_num_batched_tokens: int) -> None:
        """A sequence's drafts are fed whole in one step, with its own token: k + 1 must fit a step."""
        if self.num_speculative_tokens + 1 > max_num_batched_tokens:
            raise InvalidParam("speculative_config.num_speculative_tokens",
                               f"speculative_config.num_speculative_tokens={self.num_speculative_tokens} needs "
                               f"steps of at least {self.num_speculative_tokens + 1} tokens, but "
                               f"max_num_batched_tokens={max_num_batched_tokens}")

    def check_layers(self, num_hidden_layers: int) -> None:
        """``draft_num_layers`` must be 1 to the draft checkpoint's ``num_hidden_layers``."""
        n = self.draft_num_layers
        if n is not None and not 1 <= n <= num_hidden_layers:
            raise InvalidParam("speculative_config.draft_num_layers",
                               f"speculative_config.draft_num_layers={n} is invalid: the draft model has "
                               f"{num_hidden_layers} layers, so give 1 to {num_hidden_layers} (or leave it out: all)")

    def describe(self) -> str:
        k, off = self.num_speculative_tokens, self.disable_by_batch_size
        until = (f", off above {off} running" if off else "") + \
            (", adaptive: drafts fed where they pay" if self.enable_adaptive_verification else ", every draft fed")
        until += f", predictions up to {self.prediction_k}" if self.prediction_k != k else ""
        if self.method == "ngram":
            factor = self.prompt_lookup_spec_factor
            return (f"ngram (k={k}, prompt_lookup_min={self.prompt_lookup_min}, max={self.prompt_lookup_max}"
                    f"{f', drafts up to {factor} x the match' if factor else ''}{until})")
        if self.method == "suffix":
            depth, cached, factor, prob = self.suffix
            return (f"suffix (k={k}, tree depth {depth}, {cached} answers cached, spec factor {factor}, min token "
                    f"prob {prob}{until})")
        n = f", its first {self.draft_num_layers} layers" if self.draft_num_layers else ""
        return f"draft_model (k={k}, {self.model or 'the same model'}, {self.quantization or 'unquantized'}{n}{until})"


def suffix_options(method: str, value: dict) -> tuple:
    """The four suffix_decoding_* keys of method 'suffix', checked (defaults: vLLM's); refused for another method."""
    if method != "suffix":
        for key in SUFFIX_DEFAULTS:
            if value.get(key) is not None:
                raise InvalidParam(f"speculative_config.{key}", f"speculative_config.{key} applies to method "
                                   f"'suffix' only, not {method!r}")
        return ()
    got = {key: value.get(key, default) for key, default in SUFFIX_DEFAULTS.items()}
    check_int("speculative_config.suffix_decoding_max_tree_depth", got["suffix_decoding_max_tree_depth"], 2, 256)
    check_int("speculative_config.suffix_decoding_max_cached_requests", got["suffix_decoding_max_cached_requests"],
              0, 1_000_000)
    for key, lo, hi in (("suffix_decoding_max_spec_factor", 0.0, 64.0), ("suffix_decoding_min_token_prob", 0.0, 1.0)):
        x = got[key]
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not lo <= x <= hi or (key.endswith("factor")
                                                                                          and x == 0):
            raise InvalidParam(f"speculative_config.{key}", f"speculative_config.{key}={clip(x)} is invalid: give a "
                               f"number {'above' if key.endswith('factor') else 'from'} {lo} to {hi}")
    return tuple(got.values())

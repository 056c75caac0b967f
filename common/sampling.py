"""SamplingParams: what a request asks of the sampler, with vLLM's names and meanings, checked on arrival.

The rules it sets run elsewhere: its penalties and constraints are the request's logits processors
(common/processors.py), its temperature, min_p, top-k and top-p the sampler (common/sampler.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace

from common.validate import InvalidParam, check_bool, check_int, check_text, clip


GREEDY_BELOW = 1e-5
MAX_LOGPROBS = 20  # vLLM's default max_logprobs, and OpenAI's top_logprobs limit
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")  # StructuredOutputsParams' kinds, one at a time


@dataclass(frozen=True)
class StructuredOutputsParams:
    """vLLM's structured outputs: the output must match one constraint, applied as a mask on the logits (stage 07).

    ``json``: a JSON schema (a dict or its text); ``regex``: a regular expression the whole output matches; ``choice``:
    one of these strings; ``grammar``: an EBNF grammar (xgrammar's GBNF dialect); ``json_object``: any JSON object.
    ``disable_any_whitespace``: JSON as ``{"a": 1, "b": [2, 3]}`` only (vLLM's option; free whitespace by default)."""
    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self):
        given = [k for k in CONSTRAINTS if getattr(self, k) is not None]
        if len(given) != 1:
            raise InvalidParam("structured_outputs", f"structured_outputs takes exactly one of {', '.join(CONSTRAINTS)}"
                                                     f"; got {', '.join(given) if given else 'none'}")
        def bad(name, why):
            raise InvalidParam("structured_outputs", f"structured_outputs.{name}={clip(getattr(self, name))} is "
                                                     f"invalid: {why}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    schema = json.loads(self.json)
                except ValueError as e:
                    bad("json", f"the schema is not valid JSON ({e})")
            else:
                schema = self.json
            if not isinstance(schema, dict):
                bad("json", "must be a JSON schema: an object (a dict or its JSON text)")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                bad(name, "must be a non-empty string")
            if value is not None and not value.isascii():
                try:
                    check_text(name, value)
                except InvalidParam as e:
                    raise InvalidParam("structured_outputs", f"structured_outputs.{e}") from None
        if self.choice is not None and (not isinstance(self.choice, (list, tuple)) or not self.choice or not all(
                isinstance(c, str) and c for c in self.choice)):
            bad("choice", "must be a non-empty list of non-empty strings")
        if self.json_object is not None and self.json_object is not True:
            bad("json_object", "must be true (any JSON object)")
        check_bool("disable_any_whitespace", self.disable_any_whitespace, prefix="structured_outputs.")

    @property
    def kind(self) -> str:
        return next(k for k in CONSTRAINTS if getattr(self, k) is not None)

    @property
    def schema(self) -> dict | None:
        """The JSON schema as a dict (``json`` given as text is parsed)."""
        return json.loads(self.json) if isinstance(self.json, str) else self.json

    @classmethod
    def coerce(cls, value) -> StructuredOutputsParams | None:
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            known = [f.name for f in fields(cls)]
            unknown = sorted(str(k) for k in value if k not in known)
            if unknown:
                raise InvalidParam("structured_outputs", f"unknown structured_outputs field(s) {clip(unknown)}; "
                                                         f"known: {', '.join(known)}")
            return cls(**value)
        raise InvalidParam("structured_outputs", f"structured_outputs must be a StructuredOutputsParams or a dict, "
                                                 f"not {type(value).__name__}")


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 (or below GREEDY_BELOW) means greedy
    top_k: int = -1  # -1 (or 0) keeps every token
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)  # stop strings: the output ends before the first one
    # n samples of the prompt, vLLM's seed rule: with a seed, sample i draws from its own generator seeded seed + i
    # (exactly the request with n=1, seed=seed + i: `for_sample(i)`); without one, each sample seeds its own.
    n: int = 1
    # vLLM's penalties and constraints: the request's logits processors (each described in common/processors.py), in
    # vLLM's order; then temperature, min_p (tokens below min_p x the top probability dropped), top-k, top-p.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_p: float = 0.0
    min_tokens: int = 0
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # vLLM's logprobs: with each sampled token, its log-probability and the `logprobs` most likely tokens', of the
    # model's own distribution (raw float32 logits, as vLLM's default), so they do not move with the sampling settings.
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for every prompt token (none shared from the prefix cache)
    # OpenAI's predicted outputs: text the output is expected to repeat (a file before a small edit). Stage 06
    # drafts from it (speculative decoding); it never changes the tokens, and the other stages ignore it.
    prediction: str | None = None
    # vLLM's structured outputs (a JSON schema, a regex, a choice, a grammar): a mask on the logits that only stage 07
    # applies (the other stages refuse such a request rather than ignore it). A dict is read as its fields.
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        if self.stop is None or isinstance(self.stop, str):
            self.stop = [] if self.stop is None else [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids or [])
        self.structured_outputs = StructuredOutputsParams.coerce(self.structured_outputs)
        self.validate()

    @classmethod
    def coerce(cls, value) -> SamplingParams:
        """What the API accepts as a request's sampling parameters: None (defaults), a SamplingParams or a dict."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(str(k) for k in value if k not in FIELD_NAMES)
            if unknown:
                raise InvalidParam("sampling_params", f"unknown sampling parameter(s) {clip(unknown)}; "
                                                      f"known: {', '.join(FIELD_NAMES)}")
            return cls(**value)
        raise InvalidParam("sampling_params", f"sampling_params must be a SamplingParams or a dict, "
                                              f"not {type(value).__name__}")

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError (`InvalidParam`) naming the field that is wrong and what it accepts."""
        def bad(name, why):
            raise InvalidParam(name, f"SamplingParams.{name}={clip(getattr(self, name))} is invalid: {why}")
        def number(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)
        check_int("max_tokens", self.max_tokens, 1, prefix="SamplingParams.")
        if not number(self.temperature) or not (0.0 <= self.temperature < float("inf")):
            bad("temperature", "must be a finite number >= 0 (0 means greedy)")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            bad("top_k", "must be -1 or 0 (disabled) or a positive integer")
        if not number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            bad("top_p", "must be in (0, 1]")
        if self.seed is not None:
            check_int("seed", self.seed, 0, 2**64 - 1, prefix="SamplingParams.")  # what torch's generator takes
        check_bool("ignore_eos", self.ignore_eos, prefix="SamplingParams.")
        if not isinstance(self.stop, list) or not all(isinstance(x, str) and x for x in self.stop):
            bad("stop", "must be a string or a list of non-empty strings")
        for text in self.stop:
            check_text("stop", text, prefix="SamplingParams.")
        limit = f"[0, {vocab_size or 'vocab size'})"
        if not isinstance(self.stop_token_ids, list):
            bad("stop_token_ids", f"must be a list of integers in {limit}")
        def token_id(t):
            return isinstance(t, int) and not isinstance(t, bool) and t >= 0 and (vocab_size is None or t < vocab_size)
        for t in self.stop_token_ids:
            if not token_id(t):
                bad("stop_token_ids", f"every id must be an integer in {limit}")
        check_int("n", self.n, 1, prefix="SamplingParams.")
        if self.seed is not None and self.seed + self.n - 1 > 2**64 - 1:
            bad("seed", f"sample i draws with seed + i: seed + n - 1 must be <= 2**64 - 1 (n={self.n})")
        for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's and vLLM's range
            if not number(getattr(self, name)) or not -2.0 <= getattr(self, name) <= 2.0:
                bad(name, "must be a number in [-2, 2]")
        if not number(self.repetition_penalty) or not 0.0 < self.repetition_penalty < float("inf"):
            bad("repetition_penalty", "must be a finite number > 0 (1 disables it)")
        if not number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be a number in [0, 1]")
        check_int("min_tokens", self.min_tokens, 0, prefix="SamplingParams.")
        if self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(token_id(t) for t in self.logit_bias):
                bad("logit_bias", f"must map token ids (integers in {limit}) to biases")
            if not all(number(b) and -100.0 <= b <= 100.0 for b in self.logit_bias.values()):
                bad("logit_bias", "every bias must be a number in [-100, 100]")  # OpenAI's range
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 0, MAX_LOGPROBS, prefix="SamplingParams.")
        if self.bad_words is not None and (not isinstance(self.bad_words, list) or not all(
                isinstance(w, str) and w.strip() for w in self.bad_words)):
            bad("bad_words", "must be a list of words (non-empty strings)")
        if self.prediction is not None:
            if not isinstance(self.prediction, str):
                bad("prediction", "must be a string: the text the output is expected to repeat")
            check_text("prediction", self.prediction, prefix="SamplingParams.")
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, list) or not ids or not all(token_id(t) for t in ids):
                bad("allowed_token_ids", f"must be a non-empty list of integers in {limit}")

    @property
    def greedy(self) -> bool:
        # As in vLLM, a temperature this small is greedy: dividing logits by 1e-40 overflows them to inf (NaN odds).
        return self.temperature < GREEDY_BELOW

    def for_sample(self, i: int) -> SamplingParams:
        """Sample i of n as a request of its own (vLLM's rule): n=1 and, with a seed, seed + i."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + i)


FIELD_NAMES = [f.name for f in fields(SamplingParams)]

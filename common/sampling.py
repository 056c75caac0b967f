"""SamplingParams (vLLM's names and meanings) and the per-request sampler."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch

from common.validate import InvalidParam, check_bool, check_int, check_text, clip


GREEDY_BELOW = 1e-5


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

    def __post_init__(self):
        if self.stop is None or isinstance(self.stop, str):
            self.stop = [] if self.stop is None else [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids or [])
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
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0 or (vocab_size is not None and t >= vocab_size):
                bad("stop_token_ids", f"every id must be an integer in {limit}")

    @property
    def greedy(self) -> bool:
        # As in vLLM, a temperature this small is greedy: dividing logits by 1e-40 overflows them to inf (NaN odds).
        return self.temperature < GREEDY_BELOW


FIELD_NAMES = [f.name for f in fields(SamplingParams)]


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A request's own random stream: its draws never depend on what else is in the batch."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Next token for one request from its float32 logits row [vocab].

    One uniform draw from the request's own generator, looked up in the cumulative distribution (inverse
    transform sampling), rather than ``torch.multinomial``: on CPU that draws an exponential variate for every
    entry of the vocabulary (0.86 ms a row at 49,152; this takes about 0.07 ms), which made a step of 32 sampled
    requests spend longer sampling than running the model. top-p finds its head among the largest 1,024
    probabilities (NumPy's selection and sort of the values alone, 0.1 ms; the whole row only when those hold less
    than top-p) instead of torch's sort with indices (3.5 ms), and draws among the kept tokens. Every stage and the
    reference call this function on one row at a time, so a request's tokens never depend on the batch."""
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.numel():
        logits = logits.masked_fill(logits < kth_largest(logits, params.top_k), float("-inf"))
    probs = torch.softmax(logits, -1)
    ids = None  # with top-p, the kept tokens' ids in increasing order: the draw runs over them alone
    if params.top_p < 1.0:
        mask = nucleus(probs, params.top_p)
        ids = torch.from_numpy(np.flatnonzero(mask.numpy())) if mask.device.type == "cpu" else torch.nonzero(mask)[:, 0]
        probs = probs[ids]  # the dropped tokens add exact zeros to the cumulative sum: leaving them out changes no sum
    cumulative = probs.cumsum(0, dtype=torch.float64)
    draw = torch.rand(1, generator=generator, dtype=torch.float64, device=probs.device) * cumulative[-1]
    token = int(torch.searchsorted(cumulative, draw, right=True))  # the first entry whose cumulative mass exceeds it
    if token >= probs.numel():  # the draw rounded up to the total: the last token that has any mass
        token = int(torch.nonzero(probs)[-1])
    return token if ids is None else int(ids[token])


def kth_largest(values: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest entry of a 1-D tensor (k >= 1)."""
    if values.device.type == "cpu":  # NumPy's selection: 0.08 ms at 49,152 entries, torch.topk 0.06-1.3 ms by k
        return torch.tensor(np.partition(values.numpy(), values.numel() - k)[values.numel() - k])
    return torch.topk(values, k).values[-1]


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens top-p keeps, as a mask: in descending order of probability a token is dropped exactly when the
    tokens ranked before it already hold ``top_p`` of the mass (vLLM's rule), so the kept set is the shortest head
    that reaches ``top_p``. The tie rule: of equal probabilities the lower id ranks first (a stable descending
    sort's order), so of tokens tied at the head's last probability, the lowest ids are kept."""
    for ordered in descending_heads(probs):
        reached = (ordered.cumsum(0) - ordered >= top_p).cpu().numpy()  # the mass of the tokens ranked before each
        if reached.any() or ordered.numel() == probs.numel():
            break
    kept = int(reached.argmax()) if reached.any() else ordered.numel()  # a prefix: the first token has 0 before it
    last = ordered[kept - 1]
    mask = probs >= last
    surplus = int(mask.sum()) - kept  # tokens tied with the last kept one beyond the head's length
    if surplus > 0:
        mask.index_fill_(0, torch.nonzero(probs == last).view(-1)[-surplus:], False)
    return mask


def descending_heads(probs: torch.Tensor, first: int = 1024):
    """The largest ``first`` probabilities in descending order, then (if the caller asks on) all of them: the
    head is exactly the full order's first entries, and a cumulative sum runs in order, so its sums are the full
    one's. On CPU, NumPy's selection then a sort of the head (0.08 ms) before the whole row's sort (0.12 ms)."""
    if probs.device.type != "cpu":
        yield probs.sort(descending=True).values
        return
    values = probs.numpy()
    if first < values.size:
        head = values[np.argpartition(values, values.size - first)[values.size - first:]]
        yield torch.from_numpy(np.sort(head)[::-1].copy())
    yield torch.from_numpy(np.sort(values)[::-1].copy())


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """``logits.argmax(-1)``: the first index of each row's maximum.

    On CPU through numpy, whose argmax is vectorized: torch's CPU argmax walks a 49,152-entry row at well under a
    GB/s (32 us for one row here, 3 us in numpy). An earlier two-level argmax in torch (chunk maxima, then the
    winning chunk) took 16 us timed alone, but in a decode step of one request it cost about 0.45 ms a token more
    than numpy's: seven small tensor ops, each slow right after the step's weights have streamed through the caches."""
    if logits.device.type == "cpu":
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> list[int]:
    """One token per row. Greedy rows share one argmax; sampled rows draw from their own generator."""
    greedy = greedy_tokens(logits)
    return [greedy[i] if p.greedy else sample(logits[i], p, g)
            for i, (p, g) in enumerate(zip(params, generators))]

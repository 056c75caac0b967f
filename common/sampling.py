"""SamplingParams (vLLM's names and meanings) and the per-request sampler."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch

from common.validate import InvalidParam, check_bool, check_int, check_text, clip


GREEDY_BELOW = 1e-5
MAX_LOGPROBS = 20  # vLLM's default max_logprobs, and OpenAI's top_logprobs limit


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
    # n samples of the prompt. vLLM's seed rule (its v1 engine fans a request out into n children): with a seed,
    # sample i draws from its own generator seeded seed + i; without one, each sample seeds its own at random.
    # So sample i of a seeded request is exactly the request (n=1, seed=seed + i): `for_sample(i)`.
    n: int = 1
    # vLLM's penalties and constraints, applied to a row's float32 logits in this order (`process_logits`):
    # logit_bias, allowed_token_ids, min_tokens (EOS and stop_token_ids masked until min_tokens are out),
    # repetition_penalty (tokens of the prompt and output: positive logits divided, negative multiplied),
    # frequency_penalty (minus penalty x count in the output) and presence_penalty (minus penalty if present);
    # then temperature, min_p (tokens below min_p x the top probability dropped), top-k, top-p.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_p: float = 0.0
    min_tokens: int = 0
    allowed_token_ids: list[int] | None = None
    # vLLM's logprobs: with each sampled token, its log-probability and the `logprobs` most likely tokens'. Like
    # vLLM's default, the model's own distribution (log_softmax of the raw float32 logits, before penalties and
    # temperature), so a sampled token's figure does not move with the sampling settings.
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for every prompt token (none shared from the prefix cache)

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
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, list) or not ids or not all(token_id(t) for t in ids):
                bad("allowed_token_ids", f"must be a non-empty list of integers in {limit}")

    @property
    def greedy(self) -> bool:
        # As in vLLM, a temperature this small is greedy: dividing logits by 1e-40 overflows them to inf (NaN odds).
        return self.temperature < GREEDY_BELOW

    @property
    def adjusts_logits(self) -> bool:
        """Whether `process_logits` changes a row: a penalty, a bias, a constraint."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.allowed_token_ids is not None)

    def for_sample(self, i: int) -> SamplingParams:
        """Sample i of n as a request of its own (vLLM's rule): n=1 and, with a seed, seed + i."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + i)


FIELD_NAMES = [f.name for f in fields(SamplingParams)]


def process_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int],
                   eos_token_id: int | None) -> torch.Tensor:
    """One request's penalties and constraints on its float32 logits row [vocab], vLLM's definitions in
    SamplingParams' order. Elementwise on the one row, from the request's own tokens: its result never depends on
    the batch. Returns a new row (the model's logits stay as they are)."""
    p, logits = params, logits.clone()
    vocab, dev = logits.numel(), logits.device
    if p.logit_bias:
        ids = torch.tensor(list(p.logit_bias), device=dev)
        logits[ids] += torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype, device=dev)
    if p.allowed_token_ids is not None:
        keep = torch.zeros(vocab, dtype=torch.bool, device=dev)
        keep[torch.tensor(p.allowed_token_ids, device=dev)] = True
        logits.masked_fill_(~keep, float("-inf"))
    if len(output_ids) < p.min_tokens:
        stops = [t for t in [eos_token_id, *p.stop_token_ids] if t is not None and not (t == eos_token_id and
                                                                                         p.ignore_eos)]
        if stops:
            logits[torch.tensor(stops, device=dev)] = float("-inf")
    if p.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=dev)
        seen[torch.tensor(prompt_ids + output_ids, dtype=torch.long, device=dev)] = True
        scaled = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
        logits = torch.where(seen, scaled, logits)
    if (p.frequency_penalty or p.presence_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(output_ids, device=dev), minlength=vocab).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def token_logprobs(logits: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """(the token's log-probability, the k most likely (id, log-probability), most likely first) from one raw
    float32 logits row. The row is copied first, so its reduction never depends on where it sat in the batch."""
    lp = torch.log_softmax(logits.clone().float(), -1)
    top = torch.topk(lp, k) if k else None
    return float(lp[token]), [] if top is None else list(zip(top.indices.tolist(), top.values.tolist()))


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
    if params.min_p > 0.0:  # vLLM's min_p: drop tokens less likely than min_p x the most likely one
        probs = torch.softmax(logits, -1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
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

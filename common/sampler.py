"""The sampler: one token from one request's processed logits row, with the request's own random stream.

The rule every stage relies on: a row is sampled alone, from its own values and its own generator, so a
request's tokens never depend on the batch. Why each function is written the way it is (what the obvious
torch call cost on CPU) is in docs/ladder-runs.md, "Sampled requests".
"""
from __future__ import annotations

import numpy as np
import torch

from common.sampling import SamplingParams

Logprob = tuple[float, list[tuple[int, float]]]  # (the token's log-probability, the top k as (id, log-probability))


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
    """Next token for one request from its processed float32 logits row [vocab].

    Exactly one uniform draw per sampled token, from the request's generator, looked up in the cumulative
    distribution (inverse transform sampling): the number of draws is the number of tokens, so a request's
    stream stays where one-at-a-time decoding leaves it. Order: temperature, min_p, top-k, top-p (vLLM's)."""
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
    """The k-th largest entry of a 1-D tensor (k >= 1); NumPy's selection on CPU."""
    if values.device.type == "cpu":
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
    one's. Most rows' top-p head lies in the first 1,024, so the whole row is rarely sorted."""
    if probs.device.type != "cpu":
        yield probs.sort(descending=True).values
        return
    values = probs.numpy()
    if first < values.size:
        head = values[np.argpartition(values, values.size - first)[values.size - first:]]
        yield torch.from_numpy(np.sort(head)[::-1].copy())
    yield torch.from_numpy(np.sort(values)[::-1].copy())


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """``logits.argmax(-1)``: the first index of each row's maximum (NumPy's vectorized argmax on CPU)."""
    if logits.device.type == "cpu":
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> list[int]:
    """One token per row. Greedy rows share one argmax; sampled rows draw from their own generator."""
    greedy = greedy_tokens(logits) if any(p.greedy for p in params) else []
    return [greedy[i] if p.greedy else sample(logits[i], p, g)
            for i, (p, g) in enumerate(zip(params, generators))]


def token_logprobs(logits: torch.Tensor, token: int, k: int) -> Logprob:
    """(the token's log-probability, the k most likely (id, log-probability), most likely first) from one float32
    logits row, in float64 rounded once to float32: torch's float32 log-softmax sums in another order on each ISA
    (AVX2, AVX-512, NEON), while the float64 one, rounded, came out the same on all three (tests/test_arm64.py).
    A row of its own, so its reduction never depends on where it sat in the batch."""
    lp = torch.log_softmax(logits.double(), -1).float()
    top = torch.topk(lp, k) if k else None
    return float(lp[token]), [] if top is None else list(zip(top.indices.tolist(), top.values.tolist()))

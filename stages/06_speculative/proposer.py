"""What a proposer is: whatever guesses the next tokens of a request, handed to the scheduler in ``build``.

``limit(seq, num_running)``: whether a request is its to draft for (None: not) and how many drafts it may give this
step; ``propose(seqs, ks)`` guesses, one batched call a step; ``release()`` drops what it keeps per request. A new
way to draft is one more `Proposer` (proposers.py, draft_model.py, suffix.py; stage 07's forced.py).
"""
from __future__ import annotations

from common.sequence import Sequence


class Proposer:
    """Drafts up to ``k`` tokens for the requests it ``claims``, none while more than ``disable_by_batch_size``
    requests run (vLLM's key: batching fills the step, and speculation stops paying)."""
    cheap = True  # guessing costs next to nothing (a lookup): the policy may ask for every guess and feed a part
    pass_cost = None  # a draft model: its measured passes (cost_model.PassCost), which the policy prices drafts by

    def calibrate(self) -> None:
        """A first measurement of what guessing costs, before the first request (calibration.py); a lookup: none."""

    def __init__(self, k: int, disable_by_batch_size: int | None = None):
        self.k, self.disable_by_batch_size = k, disable_by_batch_size

    def claims(self, seq: Sequence) -> bool:
        return True

    def limit(self, seq: Sequence, num_running: int) -> int | None:
        """None when ``seq`` is not this proposer's to draft for; else the most drafts it gives it this step."""
        if not self.claims(seq):
            return None
        return 0 if num_running > (self.disable_by_batch_size or num_running) else self.k

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        raise NotImplementedError

    def release(self) -> None:
        pass  # nothing kept between steps

"""What speculation did, from every step's event alone: acceptance per position (a draft is kept up to its first
miss, so it falls), tokens per decoding step per request (1.0 without), the proposer's share of the step time.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from common.events import StepEvent


@dataclass
class SpecStats:
    drafted_at: Counter = field(default_factory=Counter)  # draft position -> drafts verified there
    accepted_at: Counter = field(default_factory=Counter)  # draft position -> of them, kept
    decode_steps: Counter = field(default_factory=Counter)  # request label -> its decode and verify steps
    decode_tokens: Counter = field(default_factory=Counter)  # request label -> tokens those steps kept
    propose_seconds: float = 0.0
    step_seconds: float = 0.0

    def reset(self) -> None:
        for counter in (self.drafted_at, self.accepted_at, self.decode_steps, self.decode_tokens):
            counter.clear()
        self.propose_seconds = self.step_seconds = 0.0

    def on_step(self, event: StepEvent) -> None:
        self.propose_seconds += event.propose_seconds
        self.step_seconds += event.duration
        for s in event.seqs:
            for i in range(s.drafted):
                self.drafted_at[i] += 1
                self.accepted_at[i] += i < s.accepted
            if s.kind != "prefill":
                self.decode_steps[s.index] += 1
                self.decode_tokens[s.index] += len(s.tokens)

    @property
    def drafted(self) -> int:
        return sum(self.drafted_at.values())

    @property
    def accepted(self) -> int:
        return sum(self.accepted_at.values())

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def acceptance_by_position(self) -> list[float]:
        return [self.accepted_at[i] / self.drafted_at[i] for i in sorted(self.drafted_at)]

    def tokens_per_step(self) -> dict[int, float]:
        """Request label -> its mean tokens kept per decoding step."""
        return {i: self.decode_tokens[i] / n for i, n in sorted(self.decode_steps.items())}

    @property
    def mean_tokens_per_step(self) -> float:
        steps = sum(self.decode_steps.values())
        return sum(self.decode_tokens.values()) / steps if steps else 0.0

    @property
    def proposer_share(self) -> float:
        return self.propose_seconds / self.step_seconds if self.step_seconds else 0.0

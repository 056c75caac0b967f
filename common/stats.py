"""What a `generate` call measured: an observer of every step's `StepEvent` (no engine writes it inline)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields

from common.events import StepEvent

HISTORY = 100_000  # steps of timeline kept


def hit_rate(hit_tokens: int, queried_tokens: int) -> float:
    """The prefix cache's hit rate: prompt tokens found over prompt tokens looked up."""
    return hit_tokens / queried_tokens if queried_tokens else 0.0


@dataclass
class EngineStats:
    """Counters across one `generate` call, built from each step's event."""
    steps: int = 0
    slot_steps_used: int = 0  # a running request occupied the slot and produced a token
    slot_steps_available: int = 0  # slots x steps
    prefill_tokens: int = 0
    decode_tokens: int = 0  # tokens fed after the prompt (draft tokens included)
    output_tokens: int = 0
    drafted_tokens: int = 0  # draft tokens fed for verification (speculative decoding)
    accepted_tokens: int = 0  # of them, kept
    wall_seconds: float = 0.0
    kv_bytes_reserved: int = 0  # peak KV memory set aside
    kv_bytes_used: int = 0  # peak KV memory holding real tokens
    peak_running: int = 0  # most requests in flight at once
    preemptions: int = 0  # requests evicted from the KV cache to be recomputed (stage 03 on)
    prefix_hit_tokens: int = 0  # prompt tokens found in the prefix cache (stage 03 on)
    prefix_query_tokens: int = 0  # prompt tokens looked up in it
    peak_blocks: int = 0  # most KV blocks held at once (stage 03 on), a shared block once
    peak_table_blocks: int = 0  # most the same sequences' block tables listed at once: held with nothing shared
    # Per step (the most recent HISTORY steps: a server runs for days): the request in each slot, KV blocks in use.
    timeline: deque = field(default_factory=lambda: deque(maxlen=HISTORY), repr=False)
    block_timeline: deque = field(default_factory=lambda: deque(maxlen=HISTORY), repr=False)

    def on_step(self, event: StepEvent) -> None:
        """Count one step: what it ran and the engine's gauges right after it."""
        state = event.state
        self.steps += 1
        self.slot_steps_available += state.num_slots
        self.slot_steps_used += len(event.seqs)
        for s in event.seqs:
            self.prefill_tokens += s.prompt_fed
            self.decode_tokens += s.fed - s.prompt_fed
            self.drafted_tokens += s.drafted
            self.accepted_tokens += s.accepted
        self.peak_running = max(self.peak_running, state.num_in_step)
        self.kv_bytes_reserved = max(self.kv_bytes_reserved, state.kv_bytes_reserved)
        self.kv_bytes_used = max(self.kv_bytes_used, state.kv_bytes_used)
        self.preemptions += len(event.preempted)
        self.prefix_hit_tokens += event.prefix_hit_tokens
        self.prefix_query_tokens += event.prefix_query_tokens
        row: list[int | None] = [None] * max(state.num_slots, len(event.seqs))
        for i, s in enumerate(event.seqs):
            row[i if s.slot is None else s.slot] = s.index
        self.timeline.append(row)
        if state.blocks is not None:
            self.block_timeline.append(state.blocks.num_used)
            self.peak_blocks = max(self.peak_blocks, state.blocks.num_used)
            self.peak_table_blocks = max(self.peak_table_blocks, sum(len(t) for t in state.blocks.tables.values()))

    @property
    def prefix_hit_rate(self) -> float:
        return hit_rate(self.prefix_hit_tokens, self.prefix_query_tokens)

    @property
    def acceptance_rate(self) -> float:
        """Of the draft tokens verified, the share kept (speculative decoding)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def slot_utilization(self) -> float:
        return self.slot_steps_used / self.slot_steps_available if self.slot_steps_available else 0.0

    @property
    def kv_waste(self) -> float:
        """Fraction of the reserved KV bytes that held no token (at the peak)."""
        return 1 - self.kv_bytes_used / self.kv_bytes_reserved if self.kv_bytes_reserved else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("timeline", "block_timeline")}
        d.update(slot_utilization=self.slot_utilization, output_tokens_per_s=self.output_tokens_per_s,
                 kv_waste=self.kv_waste, prefix_hit_rate=self.prefix_hit_rate, acceptance_rate=self.acceptance_rate)
        return d

"""What a `generate` call measured, observed from the engine after every step (no engine writes it inline)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields

from common.engine import StepResult

HISTORY = 100_000  # steps of timeline kept

@dataclass
class EngineStats:
    """Counters across one `generate` call, built from each step's `StepResult` and the engine's gauges."""
    steps: int = 0
    slot_steps_used: int = 0  # a running request occupied the slot and produced a token
    slot_steps_available: int = 0  # slots x steps
    prefill_tokens: int = 0
    decode_tokens: int = 0
    output_tokens: int = 0
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

    def observe(self, step: StepResult, engine) -> None:
        """Count one step: what it ran (``step``) and the engine's gauges right after it."""
        self.steps += 1
        self.slot_steps_available += engine.num_slots
        self.slot_steps_used += len(step.seqs)
        for seq, n, start in zip(step.seqs, step.lens, step.starts):
            prefill = max(0, min(n, seq.num_prompt_tokens - start))
            self.prefill_tokens += prefill
            self.decode_tokens += n - prefill
        self.peak_running = max(self.peak_running, engine.num_running)
        self.kv_bytes_reserved = max(self.kv_bytes_reserved, engine.kv_bytes_reserved())
        self.kv_bytes_used = max(self.kv_bytes_used, engine.kv_bytes_used())
        self.preemptions += step.preempted
        self.prefix_hit_tokens += step.prefix_hit_tokens
        self.prefix_query_tokens += step.prefix_query_tokens
        row: list[int | None] = [None] * max(engine.num_slots, len(step.seqs))
        for i, seq in enumerate(step.seqs):
            row[step.slots[i] if step.slots else i] = seq.index
        self.timeline.append(row)
        if hasattr(engine, "num_used_blocks"):
            self.block_timeline.append(engine.num_used_blocks)
            self.peak_blocks = max(self.peak_blocks, engine.num_used_blocks)
            self.peak_table_blocks = max(self.peak_table_blocks, engine.num_table_blocks)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

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
                 kv_waste=self.kv_waste, prefix_hit_rate=self.prefix_hit_rate)
        return d
